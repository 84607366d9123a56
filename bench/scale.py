"""The write budget, detection and start-up cost at 100, 1000 and 5000 nodes, measured.

``python -m bench.scale [--nodes 100,1000,5000] [--no-budget-at 5000] [--out FILE]``

Per size: a fresh shoot control plane (a real kube-apiserver + etcd) beside one seed
control plane, the REAL aggregator as its own process at its defaults (``DEFAULTS`` below,
read from its settings' fields) except DWD_NODE_GRACE=0s: a node younger than the default
grace is no candidate, and every run here creates its nodes minutes before. The dependents
are testenv/shoot.py's (no initial delays, MCM 500 ms after KCM on the way up).
The agents are bench/fleet.py's simulated ones (its docstring says how they differ from
real ones).

Every write and request rate is read from kube-apiserver's own /metrics
(apiserver_request_total, apiserver_request_duration_seconds); the aggregator's share is
the API server's count minus the simulator's own (and the benchmark's, which reads
nothing from the shoot API server during a window), so it may be off by the few requests
in flight at either end. CPU is from /proc/<pid>/stat over the window, in % of one core,
on this 2-core machine where the simulator, the aggregator, kube-apiserver and etcd all
run. Tables are printed; the raw numbers go to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx

from aggregator.act import budget
from aggregator.act.provisioner import Provisioner
from aggregator.kube.client import KubeClient
from aggregator.model.objects import NodeView
from aggregator.model.settings import Decider, Provisioning
from aggregator.observe.watcher import Observed
from bench.fleet import ZONES, Fleet, FleetThread
from bench.kapi_metrics import (
    Audit,
    Kapi,
    Series,
    audit_args,
    audited_kubeconfig,
    histogram_quantile,
    requests,
)
from bench.sampling import Window
from bench.stats import estimate, hypergeom_pmf, p_down_spread, p_down_zoned
from bench.table import print_table
from core.durations import format_duration
from core.lease import MISSING_MAX_WAIT_S, RENEW_INTERVAL, LeaseView, lease_metadata
from testenv.controllers import CONTROLLERS, DOWN
from testenv.controlplane import ControlPlane, free_port
from testenv.process import Process
from testenv.shoot import Sampler, Shoot
from testenv.wait import eventually, wait_for

# The aggregator's own defaults (testenv/shoot.py's environment has faster ones),
# read from its settings' fields.
DECIDER = Decider()
DEFAULTS = {
    "DWD_LEASE_DURATION": format_duration(DECIDER.lease_duration_s),
    "DWD_RENEW_INTERVAL": format_duration(DECIDER.fast_interval_s),
    "DWD_CONFIRM_PERIOD": format_duration(DECIDER.confirm_period_s),
    "DWD_RECOVERY_PERIOD": format_duration(DECIDER.recovery_period_s),
    "DWD_FAILURE_FRACTION": str(DECIDER.failure_fraction),
    "DWD_RECOVERY_FRACTION": str(DECIDER.recovery_fraction),
    # Not the default: see the module docstring.
    "DWD_NODE_GRACE": "0s",
    "DWD_LOG_LEVEL": "warning",
}
FAST_S = DECIDER.fast_interval_s
BUDGET = Provisioning().write_budget
THRESHOLD = DECIDER.failure_fraction
# -- the aggregator's /status


def status(port: int) -> dict[str, Any]:
    with httpx.Client(trust_env=False, timeout=10) as http:
        targets: list[dict[str, Any]] = http.get(f"http://127.0.0.1:{port}/status").json()["targets"]
        return targets[0] if targets else {}


def watch_status(
    port: int, seconds: float, until: Callable[[dict[str, Any]], bool] | None = None
) -> list[Any]:
    """(time, phase, stale, candidates, fraction) every second for ``seconds`` or until ``until``."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s = status(port)
        seen.append(
            (
                time.monotonic(),
                s.get("phase"),
                s.get("stale", 0),
                s.get("candidates", 0),
                s.get("fraction", 0.0),
            )
        )
        if until is not None and until(s):
            break
        time.sleep(1.0)
    return seen


# -- one size


@dataclass
class Run:
    n: int
    shoot: Shoot
    fleet: FleetThread
    kapi: Kapi
    names: list[str]
    audit: Audit
    kubeconfig: Path
    agg: Process | None = None
    port: int = 0

    def start_aggregator(self, **env: str) -> None:
        self.port = free_port()
        # Typed loosely: its keyword parameters (seed=, image=) are not environment variables.
        start: Callable[..., Process] = self.shoot.start_aggregator
        self.agg = start(
            **DEFAULTS,
            DWD_METRICS_ADDR=f"127.0.0.1:{self.port}",
            DWD_SHOOT_KUBECONFIG=str(self.kubeconfig),
            **env,
        )
        wait_for(lambda: _answers(self.port), 30, "the aggregator's /status", every_s=0.2)

    def pids(self) -> dict[str, int]:
        assert self.agg is not None
        return {
            "aggregator": self.agg.popen.pid,
            "kube-apiserver": self.kapi.pids["kube-apiserver"],
            "etcd": self.kapi.pids["etcd"],
            "simulator+bench": os.getpid(),
        }

    def planned(self) -> budget.Pacing:
        """The pacing the aggregator plans now: its size and slow interval (which members,
        ``sample`` says: the plan rotates, and members hand over)."""
        return budget.plan(self.names, FAST_S, BUDGET, self.fleet.zones(), now_s=time.time())

    def sample(self) -> frozenset[str]:
        """The fast sample as the aggregator handed it out: the simulated agents renewing fast."""
        return self.fleet.at_interval(FAST_S)

    def expected(self, cut: Iterable[str]) -> float:
        return estimate(cut, self.sample(), self.fleet.zones())

    def wait_healthy(self, timeout_s: float) -> float:
        """Until as many candidates as the plan's sample (more while members hand over) and
        nothing is stale."""
        t0 = time.monotonic()
        k = len(self.planned().fast)
        wait_for(
            lambda: (
                (s := status(self.port)).get("phase") == "healthy"
                and s.get("candidates", 0) >= k
                and s.get("stale") == 0
            ),
            timeout_s,
            f"{k} candidates, healthy",
            every_s=0.5,
        )
        return time.monotonic() - t0

    def aggregator_requests(self, mark: int) -> dict[str, int]:
        return self.audit.since(mark)


def _answers(port: int) -> bool:
    try:
        status(port)
    except (httpx.HTTPError, ValueError):
        return False
    return True


def _lease_writes(before: Series, after: Series) -> dict[str, float]:
    return {
        verb: requests(after, verb, "leases") - requests(before, verb, "leases")
        for verb in ("POST", "PATCH", "DELETE")
    }


def startup(run: Run) -> dict[str, Any]:
    """A fresh install: the agents start first and find no lease (404, polled ever more
    slowly, as the agent does), and the aggregator provisions N leases beside them."""
    before, mark = run.kapi.scrape(), run.audit.mark()
    missing_before = run.fleet.sent("PATCH", "leases", "404")
    run.fleet.start_renewing()
    t0 = time.monotonic()
    run.start_aggregator()
    wait_for(
        lambda: (
            requests(run.kapi.scrape(), "POST", "leases", "201") - requests(before, "POST", "leases", "201")
            >= run.n
        ),
        run.n / 50 * 3 + 60,
        f"{run.n} leases created",
        every_s=1.0,
    )
    took = time.monotonic() - t0
    after = run.kapi.scrape()
    missing = requests(after, "PATCH", "leases", "404") - requests(before, "PATCH", "leases", "404")
    run.wait_healthy(180)
    healthy_s = time.monotonic() - t0
    time.sleep(2)
    mine = run.aggregator_requests(mark)
    return {
        "provision_s": round(took, 1),
        "lease_writes": _lease_writes(before, after),
        "missing_404": missing,
        "missing_404_per_s": round(missing / took, 1),
        "missing_404_simulator": run.fleet.sent("PATCH", "leases", "404") - missing_before,
        "to_healthy_s": round(healthy_s, 1),
        "provisioned_at": t0 + took,
        "aggregator": mine,
    }


def _wait_lease_writes(run: Run, before: Series, goal: tuple[str, str], count: int, what: str) -> None:
    verb, code = goal

    def done() -> bool:
        return (
            requests(run.kapi.scrape(), verb, "leases", code) - requests(before, verb, "leases", code)
            >= count
        )

    wait_for(done, 60, what, every_s=0.5)


def churn(run: Run) -> dict[str, Any]:
    """Add 1 % of the nodes, then remove as many (of the original ones): the writes each costs."""
    count = max(1, run.n // 100)
    out: dict[str, Any] = {"nodes": count}
    for what in ("add", "remove"):
        before, mark = run.kapi.scrape(), run.audit.mark()
        if what == "add":
            added = run.fleet.add(count)
            run.names += added
            goal = ("POST", "201")
        else:
            gone = set(run.fleet.fleet.random.sample(run.names[: run.n], count))
            run.fleet.remove(gone)
            run.names = [x for x in run.names if x not in gone]
            goal = ("DELETE", "200")
        _wait_lease_writes(run, before, goal, count, f"{what}: {count} leases")
        time.sleep(5)  # re-planned intervals are written after the creates and deletes
        mine = run.aggregator_requests(mark)
        out[what] = {
            "lease_creates": mine.get("create leases", 0),
            "lease_patches": mine.get("patch leases", 0),
            "lease_deletes": mine.get("delete leases", 0),
        }
    return out


def steady(run: Run, window_s: float) -> dict[str, Any]:
    before, mark = run.kapi.scrape(), run.audit.mark()
    w = Window(run.pids()).start()
    t0 = time.monotonic()
    time.sleep(window_s)
    procs = w.stop()
    after = run.kapi.scrape()
    # The simulator's renewals per second: the budget must hold over any 10 s, not only on average.
    landed = run.fleet.landed(t0, time.monotonic())
    tens = [sum(landed[i : i + 10]) / 10 for i in range(len(landed) - 9)]
    mine = run.aggregator_requests(mark)
    patches = requests(after, "PATCH", "leases") - requests(before, "PATCH", "leases")
    out = {
        "window_s": window_s,
        "lease_patches_per_s": round(patches / window_s, 1),
        "aggregator_requests_per_s": round(sum(mine.values()) / window_s, 2),
        "aggregator_requests": mine,
        "renewals_max_10s_per_s": max(tens, default=None),
        "renewals_max_1s": max(landed, default=None),
        "patch_p50_ms": _ms(histogram_quantile(before, after, 0.5, verb="PATCH", resource="leases")),
        "patch_p99_ms": _ms(histogram_quantile(before, after, 0.99, verb="PATCH", resource="leases")),
        "processes": procs,
        "intervals": {str(k): v for k, v in sorted(run.fleet.fleet.intervals().items())},
    }
    s = status(run.port)
    out["fast_nodes"] = s.get("fast_nodes")
    out["planned_writes_per_s"] = s.get("heartbeat_writes_per_s")
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def must_not_scale(run: Run, sampler: Sampler, cut: Sequence[str], watch_s: float) -> dict[str, Any]:
    expected = run.expected(cut)
    t0 = time.monotonic()
    run.fleet.silence(cut)
    seen = watch_status(run.port, watch_s)
    down = sampler.first(lambda s: any(v == 0 for v in s.replicas.values()), after=t0)
    run.fleet.resume()
    wait_for(lambda: status(run.port).get("stale") == 0, 30, "no stale lease after resuming", every_s=0.5)
    return {
        "true_fraction": round(len(cut) / len(run.names), 3),
        "sample_fraction_expected": round(expected, 3),
        "max_fraction_reported": round(max(f for *_, f in seen), 3),
        "phases": sorted({p for _, p, *_ in seen}),
        "scaled_down": down is not None,
        "watched_s": watch_s,
    }


def must_scale(run: Run, sampler: Sampler, cut: Sequence[str]) -> dict[str, Any]:
    expected = run.expected(cut)
    t0 = time.monotonic()
    w = Window(run.pids()).start()
    run.fleet.silence(cut)
    seen = watch_status(run.port, 45, until=lambda s: s.get("phase") == "scaled-down")
    # A sample that misjudges the cut is a result, not a failure of the benchmark.
    eventually(lambda: run.shoot.replicas() == DOWN, 20)
    time.sleep(max(0.0, 20 - (time.monotonic() - t0)))  # the outage window is at least 20 s
    procs = w.stop()
    level0 = sampler.first(
        lambda s: (
            s.replicas.get("machine-controller-manager") == 0 and s.replicas.get("cluster-autoscaler") == 0
        ),
        after=t0,
    )
    all_down = sampler.first(lambda s: s.replicas == DOWN, after=t0)
    run.fleet.resume()
    t1 = time.monotonic()
    wait_for(lambda: run.shoot.replicas() == CONTROLLERS, 90, "every controller back", every_s=0.2)
    up_s = time.monotonic() - t1 if all_down is not None else None
    return {
        "true_fraction": round(len(cut) / len(run.names), 3),
        "sample_fraction_expected": round(expected, 3),
        "max_fraction_reported": round(max(f for *_, f in seen), 3),
        "to_mcm_ca_down_s": None if level0 is None else round(level0.t - t0, 1),
        "to_all_down_s": None if all_down is None else round(all_down.t - t0, 1),
        "resume_to_all_up_s": None if up_s is None else round(up_s, 1),
        "scaled_down": all_down is not None,
        "outage_processes": procs,
    }


def sampled_verdicts(run: Run, fraction: float, trials: int) -> list[dict[str, Any]]:
    """Silence a random ``fraction`` of the nodes, read the fraction the aggregator reports once
    a lease duration has passed, resume before the confirm period could complete."""
    out = []
    for _ in range(trials):
        cut = run.fleet.fleet.random.sample(run.names, round(fraction * len(run.names)))
        expected = run.expected(cut)
        run.fleet.silence(cut)
        # The lease duration + the last renewal's up to one interval + half a second: read before
        # the lease duration and the confirm period have passed, by the confirm period less
        # the interval and that half second.
        time.sleep(DECIDER.lease_duration_s + FAST_S + 0.5)
        s = status(run.port)
        run.fleet.resume()
        out.append(
            {
                "true": fraction,
                "expected_sample_fraction": round(expected, 4),
                "reported": s.get("fraction"),
                "stale": s.get("stale"),
                "candidates": s.get("candidates"),
                "verdict_down": (s.get("fraction") or 0) >= THRESHOLD,
            }
        )
        wait_for(lambda: status(run.port).get("stale") == 0, 30, "no stale lease after resuming", every_s=0.5)
        time.sleep(2)
    return out


def no_budget(run: Run, sampler: Sampler, window_s: float) -> dict[str, Any]:
    """Every node at 2 s: restart the aggregator with a budget it never reaches; once it has
    rewritten the intervals, restart the agents (a DaemonSet rollout) so all adopt 2 s at once."""
    assert run.agg is not None
    run.agg.terminate(15)

    def slow_leases() -> int:
        """Leases asking for a slow interval, as KAPI has them: the sample rotates and hands
        over, so the agents' intervals lag the leases' by a renewal."""
        fast = format_duration(FAST_S)
        leases = run.shoot.leases().values()
        return sum(1 for x in leases if (x["metadata"].get("annotations") or {}).get(RENEW_INTERVAL) != fast)

    slow = slow_leases()
    run.start_aggregator(DWD_WRITE_BUDGET="1000000")
    t0 = time.monotonic()
    wait_for(lambda: slow_leases() == 0, slow / 50 * 3 + 60, f"{slow} intervals rewritten", every_s=5.0)
    rewrite_s = time.monotonic() - t0

    async def rollout() -> None:
        await run.fleet.fleet.stop_renewing()
        for node in run.fleet.fleet.nodes.values():
            node.interval_s = FAST_S
        run.fleet.fleet.start_renewing()

    run.fleet.call(rollout)
    t1 = time.monotonic()
    time.sleep(15)
    out = steady(run, window_s)
    # An API server that cannot keep up makes leases stale: that would be a false scale-down.
    s = status(run.port)
    out["after"] = {k: s.get(k) for k in ("phase", "stale", "candidates", "reason")}
    out["scaled_down"] = (
        sampler.first(lambda x: any(v == 0 for v in x.replicas.values()), after=t1) is not None
    )
    out["renewed_within_lease"] = len(run.fleet.fleet.renewed_within(DECIDER.lease_duration_s))
    out["rewrite_s"] = round(rewrite_s, 1)
    out["wanted_patches_per_s"] = len(run.names) / FAST_S
    return out


def _settle(result: dict[str, Any], pacing: budget.Pacing) -> None:
    """Slow nodes renew first at start, next half to one and a half intervals later
    (core.lease.next_renewal_in_s): from half an interval on the rate is steady. A slow
    node's first renewal may wait out a 404 first (up to MISSING_MAX_WAIT_S)."""
    since = time.monotonic() - result["startup"]["provisioned_at"]
    settle = MISSING_MAX_WAIT_S + pacing.slow_interval_s / 2 + 5 - since
    if pacing.slow_interval_s > FAST_S and settle > 0:
        time.sleep(settle)


def _healthy_phases(run: Run, result: dict[str, Any]) -> None:
    """Start-up, churn and the steady window."""
    n = run.n
    print(f"[{n}] {n} nodes in {result['create_nodes_s']} s; starting the aggregator", file=sys.stderr)
    result["startup"] = startup(run)
    print(f"[{n}] provisioned: {result['startup']}", file=sys.stderr)
    pacing = run.planned()
    result["sample"] = len(pacing.fast)
    result["slow_interval_s"] = pacing.slow_interval_s
    result["churn"] = churn(run)
    print(f"[{n}] churn: {result['churn']}", file=sys.stderr)
    _settle(result, pacing)
    result["steady"] = steady(run, 30.0 if n <= 100 else 40.0)
    print(f"[{n}] steady: {result['steady']}", file=sys.stderr)


def _outages(run: Run, result: dict[str, Any], *, no_budget_run: bool, trials: int) -> None:
    """Cuts that must not scale down, cuts that must, random ones, and no budget."""
    n, fleet = run.n, run.fleet
    sampler = run.shoot.sampler(0.1)
    rng = random.Random(n)
    result["spread_30"] = must_not_scale(run, sampler, rng.sample(run.names, round(0.3 * len(run.names))), 30)
    result["zone_a"] = must_not_scale(run, sampler, fleet.fleet.in_zones(["zone-a"]), 30)
    print(f"[{n}] no scale-down: {result['spread_30']} {result['zone_a']}", file=sys.stderr)
    result["spread_70"] = must_scale(run, sampler, rng.sample(run.names, round(0.7 * len(run.names))))
    two = fleet.fleet.in_zones(ZONES[1:])
    rest = [x for x in run.names if x not in set(two)]
    more = rng.sample(rest, max(0, round(0.7 * len(run.names)) - len(two)))
    result["zones_bc_plus"] = must_scale(run, sampler, two + more)
    print(f"[{n}] scale-down: {result['spread_70']} {result['zones_bc_plus']}", file=sys.stderr)
    if trials:
        result["trials"] = sampled_verdicts(run, 0.5, trials) + sampled_verdicts(run, 0.7, trials)
    if no_budget_run:
        result["no_budget"] = no_budget(run, sampler, 30.0)
        print(f"[{n}] no budget: {result['no_budget']}", file=sys.stderr)
    result["simulator_requests"] = {" ".join(k): v for k, v in sorted(fleet.requests().items())}


def measure(
    n: int, seed: ControlPlane, tmp: Path, result: dict[str, Any], *, no_budget_run: bool, trials: int
) -> None:
    """Fills ``result`` as it goes: a run that fails half-way keeps what it measured."""
    namespace = f"shoot--scale--n{n}"
    result["nodes"] = n
    audit_log = tmp / f"audit-{n}.log"
    plane = ControlPlane(extra_apiserver_args=audit_args(tmp / f"audit-policy-{n}.yaml", audit_log))
    with plane.running():
        kubeconfig = audited_kubeconfig(plane, tmp / f"aggregator-{n}.kubeconfig")
        shoot = Shoot(plane, seed, namespace, tmp)
        shoot.setup(nodes=0)
        admin = plane.admin
        fleet = FleetThread(Fleet(plane.url, plane.ca_file, (str(admin.cert), str(admin.key))))
        kapi = Kapi(shoot.shoot)
        try:
            t0 = time.monotonic()
            names = fleet.add(n)
            result["create_nodes_s"] = round(time.monotonic() - t0, 1)
            run = Run(n, shoot, fleet, kapi, names, Audit(audit_log), kubeconfig)
            _healthy_phases(run, result)
            _outages(run, result, no_budget_run=no_budget_run, trials=trials)
        finally:
            fleet.close()
            kapi.close()
            shoot.close()


# -- the sampled estimate, on paper and by Monte Carlo on the real sample


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


def error_analysis(
    n: int, trials: int = 10000, fractions: Sequence[float] = (0.4, 0.5, 0.6, 2 / 3, 0.7, 0.8)
) -> list[dict[str, Any]]:
    """The chance that the aggregator's estimate lands on the other side of the threshold from
    the truth, at the simulator's node names and zones (three of a third each) and the
    aggregator's own sample (budget.plan, per zone): exact, and by Monte Carlo with random cuts
    against that sample. Spread cuts are random over the cluster; zone-shaped ones silence
    whole zones and a random part of the others. Beside them, a sample of the same size drawn
    without zones and counted plainly (hypergeometric), as before the sample was per zone."""
    paper = _Paper(n, trials)
    return [paper.spread(f) for f in fractions] + [paper.zoned(shape, share) for shape, share in ZONE_SHAPES]


def print_uneven(n: int, shares: Sequence[float] = (0.6, 0.3, 0.1)) -> None:
    """Exact P(verdict) for spread cuts when the zones are unequal: the per-zone minimum gives
    the small zone more than its share of the sample, so its members weigh less each and the
    estimate spreads a little more than with equal zones."""
    size = [round(x * n) for x in shares]
    k = len(budget.plan([f"n{i}" for i in range(n)], FAST_S, BUDGET).fast)
    allocated = budget.allocate(k, {str(z): count for z, count in enumerate(size)})
    members = [allocated[str(z)] for z in range(len(size))]
    rows = []
    for f in (0.4, 0.5, 0.6, 2 / 3, 0.7, 0.8):
        down, up = p_down_spread(size, members, round(f * n), THRESHOLD)
        rows.append([f"{f:.3g}", f"{down:.3g}", f"{up:.3g}"])
    zones, sample = "/".join(map(str, size)), "/".join(map(str, members))
    print_table(
        f"{n} nodes in zones of {zones}, sample {sample}: spread cuts, exact",
        ["true fraction", "P(down)", "P(no down)"],
        rows,
    )


def plan_cost_ms(n: int, rounds: int = 50) -> float:
    """One pass of the provisioner's plan() over n nodes whose leases are all as wanted: what a
    node or lease change other than a renewal costs the aggregator (before 4d2c959 every
    renewal woke the provisioner too)."""
    nodes = [f"fleet-node-{i:05d}" for i in range(n)]
    pacing = budget.plan(nodes, FAST_S, BUDGET)
    observed = Observed()
    observed.nodes_listed(
        [
            NodeView.from_object(
                {"metadata": {"name": x, "uid": x, "creationTimestamp": "2026-01-01T00:00:00Z"}}
            )
            for x in nodes
        ]
    )
    provisioner = Provisioner(
        cast(KubeClient, None), observed, Provisioning(), lease_duration_s=DECIDER.lease_duration_s
    )
    leases = []
    for x in nodes:
        want = provisioner.desired(x, pacing)
        lease = {
            "metadata": {
                **lease_metadata(x),
                "annotations": {RENEW_INTERVAL: want.interval},
                "ownerReferences": [{"uid": x}],
            },
            "spec": {"leaseDurationSeconds": want.duration_s, "renewTime": "2026-01-01T00:00:00.000000Z"},
        }
        leases.append(LeaseView.from_object(lease))
    observed.leases_listed(leases)
    if any(provisioner.plan(pacing)):
        raise AssertionError("the leases should be as wanted")
    t0 = time.perf_counter()
    for _ in range(rounds):
        provisioner.plan(pacing)
    return (time.perf_counter() - t0) / rounds * 1000


# -- tables


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
            f"no budget: nodes renewed within {DEFAULTS['DWD_LEASE_DURATION']} / verdict after the window",
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
OUTAGE_HEADER = (
    "cut",
    "true frac",
    "sample frac",
    "reported max",
    "MCM+CA at 0",
    "all at 0",
    "resume -> all up",
    "scaled down",
)


def _outage_row(label: str, x: dict[str, Any]) -> list[object]:
    return [
        label,
        x["true_fraction"],
        x["sample_fraction_expected"],
        x["max_fraction_reported"],
        x.get("to_mcm_ca_down_s") or "-",
        x.get("to_all_down_s") or "-",
        x.get("resume_to_all_up_s") or "-",
        "yes" if x["scaled_down"] else f"no ({x.get('watched_s', 45)} s watched)",
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


def _trial_rows(trials: list[dict[str, Any]]) -> list[list[object]]:
    return [
        [
            t["true"],
            t["expected_sample_fraction"],
            t["reported"],
            f"{t['stale']}/{t['candidates']}",
            t["verdict_down"],
        ]
        for t in trials
    ]


def print_results(r: dict[str, Any]) -> None:
    n = r["nodes"]
    rows = _heartbeat_rows(r)
    if r.get("no_budget"):
        rows += _no_budget_rows(r["no_budget"])
    print_table(f"{n} nodes: heartbeat writes", ["what", "value"], rows)
    print_table(f"{n} nodes: CPU (% of one core) and RSS (MiB)", ["when", *PROCESSES], _process_rows(r))
    print_table(
        f"{n} nodes: outages (seconds from silencing)",
        OUTAGE_HEADER,
        [_outage_row(label, r[key]) for label, key in OUTAGES],
    )
    print_table(
        f"{n} nodes: start-up and churn (lease writes on KAPI)",
        ["what", "time", "creates", "aggregator patches", "deletes"],
        _startup_rows(r),
    )
    if r.get("trials"):
        print_table(
            f"{n} nodes: random cuts, the fraction the aggregator reports against the sample's",
            ["true", "sample (predicted)", "reported", "stale/candidates", f"verdict >= {THRESHOLD:g}"],
            _trial_rows(r["trials"]),
        )


def _print_analysis(n: int) -> None:
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
    print_uneven(n)


def _run_sizes(sizes: list[int], no_budget_sizes: set[int], trials: int, out: Path) -> None:
    """Each size measured and printed; the raw numbers written to ``out`` after each."""
    results: list[dict[str, Any]] = []
    if out.exists():
        # Sizes run separately land in one file; a size run again replaces its old entry.
        results = [r for r in json.loads(out.read_text()).get("runs", []) if r.get("nodes") not in sizes]
    with ControlPlane().running() as seed, tempfile.TemporaryDirectory(prefix="dwd-scale-") as tmp:
        for n in sizes:
            r: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
            try:
                measure(n, seed, Path(tmp), r, no_budget_run=n in no_budget_sizes, trials=trials)
            except Exception as e:
                r["error"] = f"{type(e).__name__}: {e}"
                print(f"[{n}] failed: {r['error']}", file=sys.stderr)
            else:
                print_results(r)
            results = [x for x in results if x.get("nodes") != n] + [r]
            out.write_text(json.dumps({"runs": sorted(results, key=lambda x: x["nodes"])}, indent=1))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--no-budget-at", default="5000", help="sizes to run again with every node at 2 s")
    parser.add_argument("--trials", type=int, default=3, help="random 50 %% and 70 %% cuts per size")
    parser.add_argument("--out", default="/tmp/scale-results.json")
    parser.add_argument(
        "--analysis", action="store_true", help="only the sampling error, on paper and by Monte Carlo"
    )
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.nodes.split(",") if x]
    if args.analysis:
        for n in sizes:
            _print_analysis(n)
        return
    no_budget_sizes = {int(x) for x in args.no_budget_at.split(",") if x}
    _run_sizes(sizes, no_budget_sizes, args.trials, Path(args.out))
    print(f"\nraw numbers: {Path(args.out)}")


if __name__ == "__main__":
    main()
