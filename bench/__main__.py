"""``make bench``: the quick benchmarks (a few minutes), each printing its table; ``make
bench-full`` (``--full``): the long ones after them (well over an hour). ``python -m bench
--help`` lists them all and runs nothing, ``python -m bench NAME...`` runs those."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bench import (
    agent_footprint,
    agent_hostile,
    agent_imports,
    aggregator_scale,
    extensions,
    kubelet,
    lease_home,
    path,
    race,
    scale,
    seed,
)

Benchmarks = dict[str, tuple[str, Callable[[], object]]]

# In the order they run, each with what it measures and about how long it takes.
QUICK: Benchmarks = {
    "agent_footprint": ("the agent's memory and CPU per renewal (a minute)", agent_footprint.run),
    "agent_imports": ("what each of the agent's imports costs in RSS and time (10 s)", agent_imports.run),
    "agent_hostile": ("the agent's peak memory against servers that mean harm (a minute)", agent_hostile.run),
    "aggregator_scale": ("the aggregator's cost per event and per decision (a minute)", aggregator_scale.run),
    "extensions": (
        "250 Extensions created at once on a real seed, then the controller SIGKILLed (2 min)",
        lambda: extensions.main([]),
    ),
}
LONG: Benchmarks = {
    "race": (
        "make demo's two acts five times, dependency-watchdog's rule beside (25 min)",
        lambda: race.main([]),
    ),
    "path": ("slow and lossy paths against the default timings (11 min)", path.run),
    "seed": ("1 to 250 shoots, healthy and cut at once (65 min)", lambda: seed.main([])),
    "scale": ("100, 1000 and 5000 simulated nodes against real API servers (15 min)", lambda: scale.main([])),
    "lease_home": (
        "LIST costs at 5000 nodes: our leases in kube-system or kube-node-lease (2 min)",
        lease_home.run,
    ),
    "kubelet": (
        "the real kubelet's lease renewals, cuts and heals against the witness's model (5 min)",
        kubelet.run,
    ),
}
BENCHMARKS: Benchmarks = {**QUICK, **LONG}


def _listing(group: Benchmarks) -> str:
    return "\n".join(f"  {name:<17} {what}" for name, (what, _) in group.items())


def chosen(argv: list[str] | None = None) -> list[str]:
    """The benchmarks the command line asks for, in the order they run."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="The benchmarks, each printing a table (docs/measured.md has the figures).",
        epilog=(
            f"quick, run by default (make bench, a few minutes):\n{_listing(QUICK)}\n\n"
            f"long, run after them with --full (make bench-full, well over an hour):\n{_listing(LONG)}"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--full", action="store_true", help="the long ones too, after the quick ones")
    parser.add_argument("names", nargs="*", metavar="NAME", help="run only these (default: the quick ones)")
    args = parser.parse_args(argv)
    if unknown := [n for n in args.names if n not in BENCHMARKS]:
        parser.error(f"no benchmark {', '.join(unknown)} (python -m bench --help lists them)")
    if args.full and args.names:
        parser.error("--full or names, not both")
    return args.names or list(BENCHMARKS if args.full else QUICK)


def main(argv: list[str] | None = None) -> None:
    for name in chosen(argv):
        BENCHMARKS[name][1]()


if __name__ == "__main__":
    main()
