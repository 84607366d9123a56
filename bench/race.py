"""The race the project exists for, run ``--runs`` times: a cut of every node's path to KAPI,
first without protection, then with it (``make demo``'s two acts, demo/scenario.py).

    python -m bench.race [--runs 5]

Per run: cut -> the first node KCM marks Unknown without protection, and when the last one is;
cut -> KCM at 0 with the aggregator; the margin between the two. Beside them, on the kubelet
leases the unprotected act observed, what dependency-watchdog's published rule would have
decided: a model of the rule (bench/dwdrule.py), as a distribution over where its first probe
after the cut falls, not the program (which, run for real in this world, stopped KCM after
48.0-49.3 s).
"""

from __future__ import annotations

import argparse

from bench.dwdrule import Outcome, over_phases
from bench.tools.stats import min_median_max
from bench.tools.table import print_table
from demo import scenario


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.race")
    p.add_argument("--runs", type=int, default=5, help="both acts, this many times")
    args = p.parse_args(argv)
    runs: list[tuple[dict[str, float], Outcome]] = []
    for i in range(args.runs):
        renewals: list[float] = []
        measured = scenario.run(out=None, renewals=renewals)
        runs.append((measured, over_phases(renewals, seed=i)))
    rows = [
        [
            i + 1,
            f"{m['unprotected_first_unknown_s']:.1f} s",
            f"{m['unprotected_last_unknown_s']:.1f} s",
            f"{m['unprotected_endpoints_min']:.0f}",
            f"{m['cut_to_all_down_s']:.1f} s",
            f"{m['unprotected_first_unknown_s'] - m['cut_to_all_down_s']:.1f} s",
            f"{m['nodes_unknown_max']:.0f}, {m['endpoints_ready_min']:.0f}",
            min_median_max(model.kcm_s),
        ]
        for i, (m, model) in enumerate(runs)
    ]
    print_table(
        "The race: every node's path cut, without protection and then with it (10 nodes, real KCM)",
        [
            "run",
            "no protection: cut -> first node Unknown",
            "-> last node Unknown",
            "ready endpoints left",
            "protection: cut -> KCM at 0",
            "margin",
            "then: nodes Unknown, endpoints kept",
            "model of DWD's rule: cut -> KCM at 0 (min / median / max over its probe phase)",
        ],
        rows,
    )
    first = [m["unprotected_first_unknown_s"] for m, _ in runs]
    kcm = [m["cut_to_all_down_s"] for m, _ in runs]
    margin = [f - k for f, k in zip(first, kcm, strict=True)]
    model = [t for _, o in runs for t in o.kcm_s]
    print_table(
        f"Over {len(runs)} runs (min / median / max)",
        [
            "cut -> first node Unknown, no protection",
            "cut -> KCM at 0, protection",
            "margin",
            "model of DWD's rule, every run and phase",
        ],
        [[min_median_max(first), min_median_max(kcm), min_median_max(margin), min_median_max(model)]],
    )


if __name__ == "__main__":
    main()
