"""Who we are to an API server: a bearer token re-read from its file.

Projected service-account tokens rotate (kubelet swaps the file atomically), so
the token is never cached past a change of the file.
"""

from __future__ import annotations

import os

from core.errors import KubeError
from core.files import Reloaded


class CredentialError(KubeError):
    """The token file is missing, unreadable or empty."""

    @property
    def failure_class(self) -> str:
        return "token"


DEFAULT_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class TokenFile:
    """Returns the current token; re-reads only when the file changed (one stat per call)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.read = Reloaded(self.path, _read_token, self._unreadable)

    def _unreadable(self, e: OSError) -> CredentialError:
        return CredentialError(f"cannot read token file {self.path}: {e.strerror or e}")


def _read_token(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise CredentialError(f"cannot read token file {path}: {e.strerror or e}") from e
    if not token:
        raise CredentialError(f"token file {path} is empty")
    return token
