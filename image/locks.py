"""The images' Python dependencies, pinned with their hashes (image/locks/*.txt, written by
`make image-lock` with pip-tools' pip-compile from pyproject.toml).

The Containerfile installs each image's lock with ``pip install --require-hashes``; the arm64
twin takes the aarch64 wheel of each pinned compiled distribution and checks its hash against
the same lock (image/arm64.py), so both architectures carry only files the lock names.
"""

from __future__ import annotations

import re
from pathlib import Path

LOCKS = Path(__file__).resolve().parent / "locks"


def normalize(name: str) -> str:
    """A distribution's name as the lock and PyPI compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (version, sha256 hashes) of every requirement of a lock."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for requirement in re.split(r"\n(?=\S)", path.read_text()):
        head = requirement.split("\\", 1)[0].strip()
        if not head or head.startswith("#"):
            continue
        name, version = head.split("==", 1)
        hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", requirement))
        found[normalize(name)] = (version.strip(), hashes)
    return found


def lock(target: str) -> Path:
    """The lock of an image (``agent``, ``aggregator``) or of the wheel's build (``build``)."""
    return LOCKS / f"{target}.txt"
