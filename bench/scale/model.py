"""bench.scale on paper: the aggregator's sampled estimate of the stale fraction at its own
defaults, exact and by Monte Carlo against its real sample, and the cost of the provisioner's
plan (``python -m bench.scale --analysis``)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from aggregator.act import budget
from aggregator.act.provisioner import Provisioner
from aggregator.kube.client import KubeClient
from aggregator.model.objects import NodeView
from aggregator.model.settings import DeciderSettings, ProvisionSettings
from aggregator.observe.watcher import Observed
from bench.tools.stats import estimate, hypergeom_pmf, p_down_spread, p_down_zoned
from core.lease import RENEW_INTERVAL, LeaseView, lease_metadata
from testenv.worlds.agent_fleet import ZONES

# The aggregator's own defaults, read from its settings' fields.
DECIDER = DeciderSettings()
FAST_S = DECIDER.fast_interval_s
BUDGET = ProvisionSettings().write_budget
THRESHOLD = DECIDER.failure_fraction
FRACTIONS = (0.4, 0.5, 0.6, 2 / 3, 0.7, 0.8)

# Whole zones silenced, and a share of each other zone at random.
ZONE_SHAPES = [
    ("zone-a", {"zone-a": 1.0}),
    ("zone-a + 25 % of b, c", {"zone-a": 1.0, "zone-b": 0.25, "zone-c": 0.25}),
    ("zones b, c", {"zone-b": 1.0, "zone-c": 1.0}),
    ("zones b, c + 10 % of a", {"zone-b": 1.0, "zone-c": 1.0, "zone-a": 0.1}),
]


class _Paper:
    """The simulator's node names and zones at ``n`` nodes, the aggregator's sample of them,
    and the cuts drawn against it (one random generator, drawn from in the rows' order)."""

    def __init__(self, n: int, trials: int) -> None:
        self.n, self.trials = n, trials
        self.zones = {f"fleet-node-{i:05d}": ZONES[i % len(ZONES)] for i in range(n)}
        self.names = list(self.zones)
        self.fast = budget.plan(self.names, FAST_S, BUDGET, self.zones).fast
        self.size = [sum(1 for z in self.zones.values() if z == zone) for zone in ZONES]
        self.members = [sum(1 for x in self.fast if self.zones[x] == zone) for zone in ZONES]
        self.k = sum(self.members)
        self.rng = random.Random(5000)
        self.by_zone = {zone: [x for x in self.names if self.zones[x] == zone] for zone in ZONES}

    def row(
        self, shape: str, true: float, exact: tuple[float, float], draw: Callable[[], list[str]]
    ) -> dict[str, Any]:
        hits = sum(estimate(draw(), self.fast, self.zones) >= THRESHOLD for _ in range(self.trials))
        return {
            "nodes": self.n,
            "sample": self.k,
            "per_zone": self.members,
            "cut": shape,
            "true_fraction": round(true, 3),
            "p_down": exact[0],
            "p_up": exact[1],
            "p_down_monte_carlo": hits / self.trials,
            "trials": self.trials,
        }

    def spread(self, f: float) -> dict[str, Any]:
        """``f`` of the nodes silenced at random; beside it, the plain sample's chances."""
        cut = round(f * self.n)
        exact = p_down_spread(self.size, self.members, cut, THRESHOLD)
        r = self.row("spread", cut / self.n, exact, lambda: self.rng.sample(self.names, cut))
        plain = hypergeom_pmf(self.n, cut, self.k)
        need = math.ceil(THRESHOLD * self.k - 1e-9)
        r["p_down_plain"], r["p_up_plain"] = sum(plain[need:]), sum(plain[:need])
        return r

    def zoned(self, shape: str, share: Mapping[str, float]) -> dict[str, Any]:
        cuts = [round(share.get(zone, 0.0) * len(self.by_zone[zone])) for zone in ZONES]

        def draw() -> list[str]:
            return [
                x for zone, c in zip(ZONES, cuts, strict=True) for x in self.rng.sample(self.by_zone[zone], c)
            ]

        exact = p_down_zoned(self.size, self.members, cuts, THRESHOLD)
        return self.row(shape, sum(cuts) / self.n, exact, draw)


def error_analysis(n: int, trials: int = 10000) -> list[dict[str, Any]]:
    """The chance that the aggregator's estimate lands on the other side of the threshold from
    the truth, at the simulator's node names and zones (three of a third each) and the
    aggregator's own sample (budget.plan, per zone): exact, and by Monte Carlo with random cuts
    against that sample. Spread cuts are random over the cluster; zone-shaped ones silence
    whole zones and a random part of the others. Beside them, a sample of the same size drawn
    without zones and counted plainly (hypergeometric), as before the sample was per zone."""
    paper = _Paper(n, trials)
    return [paper.spread(f) for f in FRACTIONS] + [paper.zoned(shape, share) for shape, share in ZONE_SHAPES]


def uneven(n: int, shares: Sequence[float] = (0.6, 0.3, 0.1)) -> tuple[list[int], list[int], list[list[str]]]:
    """Exact P(verdict) for spread cuts when the zones are unequal: the per-zone minimum gives
    the small zone more than its share of the sample, so its members weigh less each and the
    estimate spreads a little more than with equal zones. The zones' sizes, their members of
    the sample, and a row per cut."""
    size = [round(x * n) for x in shares]
    k = len(budget.plan([f"n{i}" for i in range(n)], FAST_S, BUDGET).fast)
    allocated = budget.allocate(k, {str(z): count for z, count in enumerate(size)})
    members = [allocated[str(z)] for z in range(len(size))]
    rows = []
    for f in FRACTIONS:
        down, up = p_down_spread(size, members, round(f * n), THRESHOLD)
        rows.append([f"{f:.3g}", f"{down:.3g}", f"{up:.3g}"])
    return size, members, rows


def plan_cost_ms(n: int, rounds: int = 50) -> float:
    """One pass of the provisioner's plan() over n nodes whose leases are all as wanted: what a
    node or lease change other than a renewal costs the aggregator (before 4d2c959 every
    renewal woke the provisioner too)."""
    nodes = [f"fleet-node-{i:05d}" for i in range(n)]
    pacing = budget.plan(nodes, FAST_S, BUDGET)
    observed = Observed()
    created = {"creationTimestamp": "2026-01-01T00:00:00Z"}
    observed.nodes_listed(
        [NodeView.from_object({"metadata": {"name": x, "uid": x, **created}}) for x in nodes]
    )
    provisioner = Provisioner(
        cast(KubeClient, None), observed, ProvisionSettings(), lease_duration_s=DECIDER.lease_duration_s
    )
    leases = []
    for x in nodes:
        want = provisioner.desired(x, pacing)
        meta = {
            **lease_metadata(x),
            "annotations": {RENEW_INTERVAL: want.interval},
            "ownerReferences": [{"uid": x}],
        }
        spec = {"leaseDurationSeconds": want.duration_s, "renewTime": "2026-01-01T00:00:00.000000Z"}
        leases.append(LeaseView.from_object({"metadata": meta, "spec": spec}))
    observed.leases_listed(leases)
    if any(provisioner.plan(pacing)):
        raise AssertionError("the leases should be as wanted")
    t0 = time.perf_counter()
    for _ in range(rounds):
        provisioner.plan(pacing)
    return (time.perf_counter() - t0) / rounds * 1000
