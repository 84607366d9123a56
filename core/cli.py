"""What both programs answer before they read a setting: ``--help`` (the settings with their
defaults, listed by reading them) and ``--version``. Configuration is the environment's; any
other argument is a mistake, said as one (exit 2)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from core.config import EnvReader, settings_help

PACKAGE = "dwd-lease"


def version() -> str:
    """The release and the commit it was built from: ``0.3.0 (revision 1a2b3c4...)``."""
    from importlib import metadata  # noqa: PLC0415 (only here: the agent's memory is counted per node)

    try:
        release = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        release = "unknown (not installed)"
    return f"{release} (revision {revision()})"


def revision() -> str:
    """The commit: written into core/ by the image build (Containerfile), else the checkout's
    HEAD, read from .git's files (no git binary in an image, none needed here)."""
    here = os.path.dirname(os.path.abspath(__file__))
    stamped = _read(os.path.join(here, "REVISION"))
    if stamped:
        return stamped
    git = os.path.join(os.path.dirname(here), ".git")
    if os.path.isfile(git):  # a worktree's: "gitdir: <its directory in the repository>"
        git = _read(git).removeprefix("gitdir: ")
    head = _read(os.path.join(git, "HEAD"))
    if not head.startswith("ref: "):
        return head or "unknown"  # detached: the commit itself
    ref = head.removeprefix("ref: ")
    common = os.path.join(git, _read(os.path.join(git, "commondir")) or ".")
    loose = _read(os.path.join(git, ref)) or _read(os.path.join(common, ref))
    if loose:
        return loose
    packed = _read(os.path.join(common, "packed-refs")).splitlines()
    return next((line.split()[0] for line in packed if line.endswith(" " + ref)), "unknown")


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def answer(
    prog: str, argv: Sequence[str], *, about: str, usage: str, read: Callable[[EnvReader], object]
) -> None:
    """Exits after answering ``--help`` or ``--version``; returns when there is no argument."""
    if not argv:
        return
    if argv[0] in ("-h", "--help"):
        print(f"{prog} {version()}: {about}\n\nusage:\n{usage}\n")
        print("settings (environment variables, with their defaults):")
        print(settings_help(read))
        sys.exit(0)
    if argv[0] == "--version":
        print(f"{prog} {version()}")
        sys.exit(0)
    print(f"{prog}: unknown argument {argv[0]!r} (settings are environment variables)", file=sys.stderr)
    print(f"usage:\n{usage}", file=sys.stderr)
    sys.exit(2)
