"""A value loaded from a file, and loaded again only when the file changed.

Credentials rotate under a running process (kubelet swaps a projected token's
file atomically; a kubeconfig Secret is updated in place): one stat per use
notices it, without re-reading an unchanged file on every request.

Paths are strings: pathlib would cost the agent 0.6 MiB on every node for two calls.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Reloaded(Generic[T]):
    """``load(path)`` on first use and whenever the file's inode, mtime or size changed;
    ``unreadable(error)`` is what a failed stat raises (it names the file its own way)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        load: Callable[[str], T],
        unreadable: Callable[[OSError], Exception],
    ) -> None:
        self.path = os.fspath(path)
        self._load = load
        self._unreadable = unreadable
        self._key: tuple[int, int, int] | None = None
        self._value: T | None = None

    def __call__(self) -> T:
        try:
            st = os.stat(self.path)
        except OSError as e:
            raise self._unreadable(e) from e
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._value is None or key != self._key:
            self._value = self._load(self.path)
            self._key = key
        return self._value
