"""The aggregator's own cost at 5000 nodes: the decision, the event handling, the pacing plan.

In-process on plain data (the same code the aggregator runs per target), so
the numbers are the aggregator's, not the API server's.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from aggregator.act import budget
from aggregator.decide.decider import Look, decide
from aggregator.model.objects import NodeView
from aggregator.model.settings import DeciderSettings, ProvisionSettings
from aggregator.model.verdict import Memory, Phase
from aggregator.observe.watcher import Observed
from bench.tools.table import print_table
from core.durations import format_duration
from core.lease import RENEW_INTERVAL, LeaseView, format_micro_time, lease_metadata

DECIDER = DeciderSettings()


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _lease(name: str, renew: str) -> dict[str, Any]:
    return {
        "metadata": {
            **lease_metadata(name),
            "resourceVersion": "1",
            "annotations": {RENEW_INTERVAL: format_duration(DECIDER.fast_interval_s)},
        },
        "spec": {
            "holderIdentity": name,
            "renewTime": renew,
            "leaseDurationSeconds": round(DECIDER.lease_duration_s),
        },
    }


def _observed(n: int, clock: list[float]) -> tuple[Observed, float]:
    """n nodes and their leases listed; the max RSS growth that cost, MiB."""
    observed = Observed(clock=lambda: clock[0])
    created = "2026-01-01T00:00:00Z"
    rss0 = _rss_mib()
    observed.nodes_listed(
        [
            NodeView.from_object(
                {"metadata": {"name": f"node-{i}", "uid": str(i), "creationTimestamp": created}}
            )
            for i in range(n)
        ]
    )
    observed.leases_listed(
        [LeaseView.from_object(_lease(f"node-{i}", format_micro_time(datetime.now(UTC)))) for i in range(n)]
    )
    return observed, _rss_mib() - rss0


def _per_event_us(observed: Observed, n: int, clock: list[float], events: int = 50_000) -> float:
    lines = [
        json.dumps(
            {"type": "MODIFIED", "object": _lease(f"node-{i % n}", f"2026-01-01T00:00:{i % 60:02d}.{i:06d}Z")}
        )
        for i in range(events)
    ]
    t0 = time.perf_counter()
    for line in lines:
        clock[0] += 0.0004
        event = json.loads(line)  # what the watch loop does with each line, then hands it on
        observed.lease_event(event["type"], LeaseView.from_object(event["object"]))
    return (time.perf_counter() - t0) / events * 1e6


def _decision_ms(observed: Observed, now: float, sample: Collection[str] | None, ticks: int = 200) -> float:
    """One decision on ``sample`` (all nodes, if None) with a view current since long before:
    every tick is judged, as in steady state."""
    params = DeciderSettings(node_grace_s=0)
    t0 = time.perf_counter()
    for _ in range(ticks):
        decide(
            Look(observed.nodes, observed.leases, now, params, Memory(Phase.HEALTHY, 0), 0.0, sample=sample)
        )
    return (time.perf_counter() - t0) / ticks * 1000


def run(n: int = 5000) -> None:
    clock = [1000.0]
    observed, rss_mib = _observed(n, clock)
    per_event_us = _per_event_us(observed, n, clock)
    budget_per_s = ProvisionSettings().write_budget
    t0 = time.perf_counter()
    pacing = budget.plan(observed.nodes, DECIDER.fast_interval_s, budget_per_s)
    plan_ms = (time.perf_counter() - t0) * 1000
    sample_ms = _decision_ms(observed, clock[0], pacing.fast)
    all_ms = _decision_ms(observed, clock[0], None)
    print_table(
        f"Aggregator cost per target at {n} nodes (in-process, plain data)",
        ["measure", "value"],
        [
            ["memory for the observed nodes and leases, MiB (max RSS growth)", f"{rss_mib:.1f}"],
            ["one watch event: JSON line parsed and observed, µs", f"{per_event_us:.1f}"],
            ["events/s one core could take", f"{1e6 / per_event_us:,.0f}"],
            ["pacing plan (who renews fast), ms", f"{plan_ms:.1f}"],
            [f"fast sample at a {budget_per_s:g} writes/s budget", f"{len(pacing.fast)} nodes"],
            ["one decision on the sample, ms", f"{sample_ms:.2f}"],
            ["one decision on all nodes, ms", f"{all_ms:.2f}"],
        ],
    )


if __name__ == "__main__":
    run()
