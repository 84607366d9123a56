"""``python -m testenv build | run -- COMMAND... | path | manifests``.

``run`` starts a control plane, runs COMMAND with KUBECONFIG (admin),
TESTENV_URL and TESTENV_CA exported, stops everything when COMMAND exits and
returns its exit code.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testenv.base import binaries
from testenv.gardener import dependency_watchdog, grm
from testenv.gardener.apply import GENERATED, generated
from testenv.kube.controlplane import ControlPlane, env_for


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testenv")
    sub = parser.add_subparsers(dest="verb", required=True)
    b = sub.add_parser(
        "build",
        help="build the pinned binaries (KAPI, etcd, KCM, kustomize, GRM, DWD, our Gardener types check)",
    )
    b.add_argument("--force", action="store_true")
    b.add_argument(
        "--demo", action="store_true", help="only what make demo runs: kube-apiserver, KCM, kubemark, etcd"
    )
    b.add_argument(
        "--part",
        choices=("first", "rest"),
        help="first: what most tests need (kube-apiserver, KCM, kubemark, etcd, kustomize); "
        "rest: GRM with our Gardener types check, and DWD (make test starts its clock-bound "
        "tests after the first, the rest building beside them)",
    )
    sub.add_parser("path", help="print where each pinned binary is cached")
    sub.add_parser("manifests", help="render the generated manifests (objects, registration)")
    r = sub.add_parser("run", help="run COMMAND against a fresh control plane")
    r.add_argument("--san", action="append", default=[], help="extra name in the serving certificate")
    r.add_argument("command", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    if args.verb == "build":
        build_all(force=args.force, demo=args.demo, part=args.part)
        return 0
    if args.verb == "manifests":
        binaries.build(only=(binaries.KUSTOMIZE,))  # kustomize alone: no kube-apiserver build
        root = Path(__file__).resolve().parents[1]
        for target in GENERATED:
            (root / target).parent.mkdir(parents=True, exist_ok=True)
            (root / target).write_text(generated(root, target))
            print(f"testenv: wrote {target}", file=sys.stderr)
        return 0
    if args.verb == "path":
        print(*paths(), sep="\n")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run needs a COMMAND after --")
    cp = ControlPlane(extra_sans=args.san)
    started = time.monotonic()
    # SIGTERM must run the clean-up below, like Ctrl-C does; and Ctrl-C must, even where this
    # process started with SIGINT ignored (a background job of a shell without job control):
    # Python then installs no handler of its own.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cp.start()
        print(
            f"testenv: control plane ready at {cp.url} in {time.monotonic() - started:.1f}s", file=sys.stderr
        )
        return subprocess.call(command, env={**os.environ, **env_for(cp)})
    except KeyboardInterrupt:
        return 130
    finally:
        cp.stop()


def paths() -> list[Path]:
    """Where each pinned binary is (or will be) cached."""
    out = [binaries.binary_path(c) for c in binaries.COMPONENTS]
    return [*out, *(b.binary_path() for b in grm.TREE_BINARIES), dependency_watchdog.binary_path()]


def build_all(*, force: bool, demo: bool = False, part: str | None = None) -> None:
    """Every pinned binary, the unrelated builds side by side: a cold build mostly fetches
    modules (GRM's alone are about 850 MB) while another compiles, so together they take
    about the longest one's time, not the sum (docs/development.md). kube-controller-manager
    and kubemark are built in kube-apiserver's go build; our Gardener types check is built in
    GRM's go build (grm.TREE_BINARIES). ``demo``: only what ``make demo`` runs (a cold build
    of everything took 11 min here, 455 s of it kube-apiserver's competing with GRM's)."""
    if demo:
        binaries.build_demo(force=force)
        return
    rest = [(c,) for c in binaries.COMPONENTS if c not in binaries.KUBERNETES]
    with concurrent.futures.ThreadPoolExecutor(max_workers=3 + len(rest)) as pool:
        builds: list[concurrent.futures.Future[object]] = []
        if part != "rest":
            builds += [
                pool.submit(binaries.build, force=force, only=only) for only in (binaries.KUBERNETES, *rest)
            ]
        if part != "first":
            builds.append(pool.submit(grm.build, force=force))
            builds.append(pool.submit(dependency_watchdog.build, force=force))
        for done in concurrent.futures.as_completed(builds):
            done.result()  # the first failure stops `make testenv`; the others finish first


if __name__ == "__main__":
    sys.exit(main())
