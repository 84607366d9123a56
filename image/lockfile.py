"""A build's lock file, held while the build runs: whoever needs what it makes meanwhile waits
for its end instead of failing or building it a second time. The images' build (image/build.py)
and the test binaries' (testenv/base/binaries.py) both use it; it lives here because testenv may
import image/ and not the other way round. Standard library only: testenv/base/binaries.py runs
before the venv exists."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def held(lock: Path) -> Iterator[None]:
    """``lock`` held exclusively until the block ends (after any other holder's end)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def wait_until_free(lock: Path, what: str, timeout_s: float = 3600) -> None:
    """Returns at once unless someone holds ``lock``; then when they let it go, or raises
    TimeoutError naming ``what`` after ``timeout_s``."""
    if not lock.exists():
        return
    deadline = time.monotonic() + timeout_s
    with open(lock) as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what} still building after {timeout_s:.0f}s") from None
                time.sleep(1)
