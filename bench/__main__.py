"""``make bench``: every benchmark, each printing its table; ``python -m bench --help`` lists
them and runs nothing, ``python -m bench NAME...`` runs those."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bench import (
    agent_footprint,
    aggregator_scale,
    detection,
    faults,
    node_objects,
    path,
    race,
    scale,
    seed,
    witness_cost,
    witness_cut,
)

# In the order make bench runs them, each with what it measures and about how long it takes.
BENCHMARKS: dict[str, tuple[str, Callable[[], object]]] = {
    "agent_footprint": ("the agent's memory and CPU per renewal (a minute)", agent_footprint.run),
    "aggregator_scale": ("the aggregator's cost per event and per decision (a minute)", aggregator_scale.run),
    "node_objects": ("5000 nodes on a real kube-apiserver (about a minute)", node_objects.run),
    "detection": ("last renewal -> controllers at 0, and back (a few minutes)", detection.run),
    "race": (
        "make demo's two acts five times, dependency-watchdog's rule beside (25 min)",
        lambda: race.main([]),
    ),
    "witness_cut": ("real cuts, today's aggregator and the one before the witness (12 min)", witness_cut.run),
    "path": ("slow and lossy paths against the default timings (11 min)", path.run),
    "faults": ("the fault suite: random outages, kills and seed faults (18 min)", faults.run),
    "seed": ("1 to 250 shoots, healthy and cut at once (65 min)", lambda: seed.main([])),
    "witness_cost": (
        "5000 kubelet leases at 500 writes/s: what reading them costs (4 min)",
        lambda: witness_cost.main(["--no-node-objects"]),
    ),
    "scale": ("100, 1000 and 5000 simulated nodes against real API servers (15 min)", lambda: scale.main([])),
}


def main(argv: list[str] | None = None) -> None:
    listing = "\n".join(f"  {name:<17} {what}" for name, (what, _) in BENCHMARKS.items())
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="The benchmarks, each printing a table (docs/measured.md has the figures).",
        epilog=f"benchmarks, in the order they run:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="run only these (default: all)")
    args = parser.parse_args(argv)
    if unknown := [n for n in args.names if n not in BENCHMARKS]:
        parser.error(f"no benchmark {', '.join(unknown)} (python -m bench --help lists them)")
    for name in args.names or BENCHMARKS:
        BENCHMARKS[name][1]()


if __name__ == "__main__":
    main()
