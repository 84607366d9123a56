"""Who we are to an API server: a bearer token re-read from its file.

Projected service-account tokens rotate (kubelet swaps the file atomically), so
the token is never cached past a change of the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.errors import KubeError


class CredentialError(KubeError):
    """The token file is missing, unreadable or empty."""

    @property
    def failure_class(self) -> str:
        return "token"


DEFAULT_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class TokenFile:
    """Returns the current token; re-reads only when the file changed (one stat per call)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._key: tuple[int, int, int] | None = None
        self._token = ""

    def read(self) -> str:
        try:
            st = self.path.stat()
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key != self._key:
                token = self.path.read_text().strip()
                if not token:
                    raise CredentialError(f"token file {self.path} is empty")
                self._token, self._key = token, key
        except OSError as e:
            raise CredentialError(f"cannot read token file {self.path}: {e.strerror or e}") from e
        return self._token
