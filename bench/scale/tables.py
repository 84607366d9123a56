"""bench.scale's tables: per size, the heartbeat writes, the processes' CPU and RSS, the
outages, start-up and churn, the random cuts; and the sampling error on paper (--analysis)."""

from __future__ import annotations

from typing import Any

from bench.scale.model import BUDGET, DECIDER, THRESHOLD, error_analysis, plan_cost_ms, uneven
from bench.tools.table import Column, print_columns, print_table
from core.durations import format_duration

LEASE_DURATION = format_duration(DECIDER.lease_duration_s)


def _breakdown(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"


def _heartbeat_rows(r: dict[str, Any]) -> list[list[object]]:
    n, st = r["nodes"], r["steady"]
    return [
        ["nodes / fast sample / slow interval", f"{n} / {r['sample']} / {r['slow_interval_s']:g} s"],
        ["fleet intervals (s: nodes)", ", ".join(f"{k}: {v}" for k, v in st["intervals"].items())],
        ["planned heartbeat writes/s (aggregator)", st["planned_writes_per_s"]],
        [
            f"lease PATCHes/s on KAPI, all writers ({st['window_s']:g} s window)",
            f"{st['lease_patches_per_s']} (budget {BUDGET:g})",
        ],
        [
            "simulator's renewals landed: busiest 10 s (per s) / busiest second",
            f"{st['renewals_max_10s_per_s']} / {st['renewals_max_1s']}",
        ],
        ["PATCH lease latency p50 / p99", f"{st['patch_p50_ms']} / {st['patch_p99_ms']} ms"],
        [
            "aggregator requests/s on the shoot KAPI (audit log)",
            f"{st['aggregator_requests_per_s']} ({_breakdown(st['aggregator_requests'])})",
        ],
    ]


def _no_budget_rows(nb: dict[str, Any]) -> list[list[object]]:
    return [
        [
            "no budget: lease PATCHes/s wanted / on KAPI",
            f"{nb['wanted_patches_per_s']:g} / {nb['lease_patches_per_s']}",
        ],
        ["no budget: PATCH lease latency p50 / p99", f"{nb['patch_p50_ms']} / {nb['patch_p99_ms']} ms"],
        [
            "no budget: aggregator requests/s",
            f"{nb['aggregator_requests_per_s']} ({_breakdown(nb['aggregator_requests'])})",
        ],
        ["no budget: aggregator's rewrite of the intervals", f"{nb['rewrite_s']} s"],
        [
            f"no budget: nodes renewed within {LEASE_DURATION} / verdict after the window",
            f"{nb['renewed_within_lease']} / {nb['after']['phase']}, {nb['after']['stale']} of "
            f"{nb['after']['candidates']} stale, scaled down: {nb['scaled_down']}",
        ],
    ]


PROCESSES = ("aggregator", "kube-apiserver", "etcd", "simulator+bench")


def _process_rows(r: dict[str, Any]) -> list[list[object]]:
    procs = [
        ("healthy, idle (steady window)", r["steady"]["processes"]),
        ("outage (70 % spread, >= 20 s)", r["spread_70"]["outage_processes"]),
    ]
    if r.get("no_budget"):
        procs.append(("no budget, all at 2 s", r["no_budget"]["processes"]))
    return [[when, *(f"{p[k]['cpu_pct']} % / {p[k]['rss_mib']}" for k in PROCESSES)] for when, p in procs]


OUTAGES = (
    ("30 % spread", "spread_30"),
    ("zone-a (1 of 3)", "zone_a"),
    ("70 % spread", "spread_70"),
    ("zones b+c + a few of a", "zones_bc_plus"),
)
OUTAGE: list[Column[dict[str, Any]]] = [
    ("cut", lambda x: x["cut"]),
    ("true frac", lambda x: x["true_fraction"]),
    ("sample frac", lambda x: x["sample_fraction_expected"]),
    ("reported max", lambda x: x["max_fraction_reported"]),
    ("MCM+CA at 0", lambda x: x.get("to_mcm_ca_down_s") or "-"),
    ("all at 0", lambda x: x.get("to_all_down_s") or "-"),
    ("resume -> all up", lambda x: x.get("resume_to_all_up_s") or "-"),
    ("scaled down", lambda x: "yes" if x["scaled_down"] else f"no ({x.get('watched_s', 45)} s watched)"),
]


def _startup_rows(r: dict[str, Any]) -> list[list[object]]:
    su, ch = r["startup"], r["churn"]
    mine = su["aggregator"]

    def churned(what: str, label: str) -> list[object]:
        x = ch[what]
        return [
            f"{label} {ch['nodes']} nodes (1 %)",
            "",
            x["lease_creates"],
            x["lease_patches"],
            x["lease_deletes"],
        ]

    return [
        ["create N Node objects (simulator)", f"{r['create_nodes_s']} s", "-", "-", "-"],
        [
            "agents, then aggregator start -> N leases",
            f"{su['provision_s']} s",
            *(mine.get(f"{verb} leases", 0) for verb in ("create", "patch", "delete")),
        ],
        [
            "meanwhile: agents' PATCHes answered 404 (per s)",
            f"{su['missing_404']:g} ({su['missing_404_per_s']}/s)",
            "-",
            "-",
            "-",
        ],
        ["aggregator start -> sample judged healthy", f"{su['to_healthy_s']} s", "-", "-", "-"],
        churned("add", "add"),
        churned("remove", "remove"),
    ]


TRIAL: list[Column[dict[str, Any]]] = [
    ("true", lambda t: t["true"]),
    ("sample (predicted)", lambda t: t["expected_sample_fraction"]),
    ("reported", lambda t: t["reported"]),
    ("stale/candidates", lambda t: f"{t['stale']}/{t['candidates']}"),
    (f"verdict >= {THRESHOLD:g}", lambda t: t["verdict_down"]),
]


def print_results(r: dict[str, Any]) -> None:
    n = r["nodes"]
    rows = _heartbeat_rows(r)
    if r.get("no_budget"):
        rows += _no_budget_rows(r["no_budget"])
    print_table(f"{n} nodes: heartbeat writes", ["what", "value"], rows)
    print_table(f"{n} nodes: CPU (% of one core) and RSS (MiB)", ["when", *PROCESSES], _process_rows(r))
    cuts = [{"cut": label, **r[key]} for label, key in OUTAGES]
    print_columns(f"{n} nodes: outages (seconds from silencing)", OUTAGE, cuts)
    print_table(
        f"{n} nodes: start-up and churn (lease writes on KAPI)",
        ["what", "time", "creates", "aggregator patches", "deletes"],
        _startup_rows(r),
    )
    if r.get("trials"):
        title = f"{n} nodes: random cuts, the fraction the aggregator reports against the sample's"
        print_columns(title, TRIAL, r["trials"])


def print_analysis(n: int) -> None:
    """--analysis at one size: the provisioner's cost, the sampling error, uneven zones."""
    cost = plan_cost_ms(n)
    print(f"\n{n} nodes: the provisioner's plan() takes {cost:.2f} ms", end="")
    share = f"{cost * BUDGET / 10:.0f} % of a core"
    print(f" ({share} if run for each of {BUDGET:g} renewals/s, as before 4d2c959)")
    rows = error_analysis(n)
    print_table(
        f"{n} nodes, sample {rows[0]['sample']} ({'/'.join(map(str, rows[0]['per_zone']))} per zone):"
        f" P(scale-down verdict), estimate >= {THRESHOLD}",
        [
            "cut",
            "true fraction",
            "P(down) exact",
            "P(no down) exact",
            f"P(down) Monte Carlo ({rows[0]['trials']} cuts)",
            "P(down) / P(no down), plain sample without zones",
        ],
        [
            [
                r["cut"],
                f"{r['true_fraction']:.3g}",
                f"{r['p_down']:.3g}",
                f"{r['p_up']:.3g}",
                f"{r['p_down_monte_carlo']:.3g}",
                f"{r['p_down_plain']:.3g} / {r['p_up_plain']:.3g}" if "p_down_plain" in r else "",
            ]
            for r in rows
        ],
    )
    size, members, exact = uneven(n)
    print_table(
        f"{n} nodes in zones of {'/'.join(map(str, size))}, sample {'/'.join(map(str, members))}:"
        " spread cuts, exact",
        ["true fraction", "P(down)", "P(no down)"],
        exact,
    )
