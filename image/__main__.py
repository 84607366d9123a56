"""``python -m image build [--base REF] [--force] | charts | inspect``: see image/build.py and
image/charts.py."""

from __future__ import annotations

import argparse
import sys

from image import build, charts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m image")
    sub = parser.add_subparsers(dest="verb", required=True)
    b = sub.add_parser("build", help="build both images into build/images/ (a copy from the cache when warm)")
    b.add_argument("--base", help="a registry base image for both stages (default: Debian bases made here)")
    b.add_argument("--force", action="store_true", help="build even when the cache has these inputs")
    sub.add_parser("charts", help="both charts' OCI artifacts into build/charts/ (build makes them too)")
    sub.add_parser("inspect", help="skopeo inspect both archives")
    args = parser.parse_args(argv)
    try:
        if args.verb == "build":
            for target, path in build.build(args.base, force=args.force).items():
                print(f"{target}: {path} ({path.stat().st_size / 1e6:.1f} MB archive)")
        if args.verb in ("build", "charts"):
            for name, path in charts.build().items():
                print(f"{name}: {path} (chart, {path.stat().st_size / 1e3:.0f} kB artifact)")
        elif args.verb == "inspect":
            for target in build.TARGETS:
                print(build.run(["skopeo", "inspect", f"oci-archive:{build.archive(target)}"]))
    except build.ImageError as e:
        print(f"image: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
