"""What both programs answer before they read a setting: ``--help`` (the settings with their
defaults, listed by reading them) and ``--version``. Configuration is the environment's; any
other argument is a mistake, said as one (exit 2)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from core.config import EnvReader, settings_help

PACKAGE = "dwd-lease"


def version() -> str:
    from importlib import metadata  # noqa: PLC0415 (only here: the agent's memory is counted per node)

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


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
