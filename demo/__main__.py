"""``make demo``: python -m demo [--fast] [--protected-only] [--keep DIR]."""

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
    parser.add_argument("--protected-only", action="store_true", help="act 2 alone, without act 1")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep its logs in DIR")
    args = parser.parse_args()
    try:
        times = scenario.run(
            nodes=args.nodes,
            overrides=FAST if args.fast else None,
            unprotected=not args.protected_only,
            keep=args.keep,
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
