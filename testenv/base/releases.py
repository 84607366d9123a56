"""Earlier releases of this project, as CHANGELOG.md names them (``## [0.2.0] - DATE (commit
HASH)``), and their sources unpacked from git: what the upgrade and rollback tests run beside
this one."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = re.compile(r"^## \[(?P<version>[^\]]+)\] - \S+ \(commit (?P<commit>[0-9a-f]{7,40})\)", re.M)


def released(changelog: Path = ROOT / "CHANGELOG.md") -> list[tuple[str, str]]:
    """(version, commit) of every release the changelog names, newest first."""
    return [(m["version"], m["commit"]) for m in HEADER.finditer(changelog.read_text())]


def previous(
    changelog: Path = ROOT / "CHANGELOG.md", version_file: Path = ROOT / "VERSION"
) -> tuple[str, str]:
    """The release this one replaces: the newest the changelog names with a commit, other than
    this one (VERSION; its own entry names the commit it was cut from)."""
    this = version_file.read_text().strip()
    found = [(version, commit) for version, commit in released(changelog) if version != this]
    if not found:
        raise LookupError(f"{changelog} names no release before {this} with its commit")
    return found[0]


def unpack(commit: str, into: Path, paths: tuple[str, ...] = ("core", "agent", "aggregator")) -> Path:
    """``paths`` as they were at ``commit``, under ``into``; a clear error when this clone does
    not have the commit (a shallow one)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, *paths], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise LookupError(
            f"commit {commit} is not in this clone ({archive.stderr.decode().strip()}): "
            "the upgrade tests build the previous release from it (git fetch --unshallow)"
        )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into
