"""``make demo``: python -m demo [--fast] [--roll] [--protected-only] [--keep DIR] [--picture FILE]
[--plain] [--setting DWD_NAME=VALUE]..."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from demo import scenario

FAST = {
    "DWD_LEASE_DURATION": "4s",
    "DWD_RENEW_INTERVAL": "1s",
    "DWD_CONFIRM_PERIOD": "2s",
    "DWD_RECOVERY_PERIOD": "4s",
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=scenario.__doc__)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--fast", action="store_true", help="shorter lease duration and periods")
    parser.add_argument(
        "--roll", action="store_true", help="the cut comes as every agent stops in a roll of their DaemonSet"
    )
    parser.add_argument("--protected-only", action="store_true", help="act 2 alone, without act 1")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep its logs in DIR")
    parser.add_argument(
        "--picture",
        type=Path,
        metavar="FILE",
        help="the race drawn as an SVG (default: demo-result.svg in DIR of --keep, else here)",
    )
    parser.add_argument(
        "--plain", action="store_true", help="a line per sample on a terminal too, not the board"
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="DWD_NAME=VALUE",
        help="an aggregator setting over its defaults (repeatable), e.g. DWD_LEASE_DURATION=6s",
    )
    args = parser.parse_args()
    settings = dict(FAST if args.fast else {})
    for item in args.setting:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("DWD_"):
            parser.error(f"--setting {item!r}: not DWD_NAME=VALUE")
        settings[name] = value
    try:
        times = scenario.run(
            nodes=args.nodes,
            overrides=settings or None,
            unprotected=not args.protected_only,
            roll=args.roll,
            keep=args.keep,
            picture=args.picture or (args.keep or Path()) / "demo-result.svg",
            live=False if args.plain else None,
        )
    except TimeoutError as e:
        print(e, file=sys.stderr)
        return 1
    print("\nmeasured:")
    for k, v in times.items():
        print(f"  {k:22} {v:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
