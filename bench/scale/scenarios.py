"""bench.scale's world and what it does in it: a shoot with its simulated agents, the real
aggregator at its defaults, and the phases measured one after another (start-up, churn, the
steady window, cuts that must and must not scale down, random cuts, no budget)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from aggregator.act import budget
from bench.scale.model import BUDGET, DECIDER, FAST_S, THRESHOLD
from bench.tools.sampling import Window
from bench.tools.stats import estimate
from core.durations import format_duration
from core.lease import RENEW_INTERVAL
from testenv.base.process import Process
from testenv.base.wait import eventually, wait_for
from testenv.kube.audit import Audit
from testenv.kube.controllers import CONTROLLERS, DOWN
from testenv.kube.controlplane import free_port
from testenv.kube.kapi_metrics import Kapi, Series, histogram_quantile, requests
from testenv.worlds.agent_fleet import FleetThread
from testenv.worlds.shoot_world import Sampler, Shoot

# The aggregator's defaults (testenv/worlds/shoot_world.py's environment has faster ones).
DEFAULTS = {
    "DWD_LEASE_DURATION": format_duration(DECIDER.lease_duration_s),
    "DWD_RENEW_INTERVAL": format_duration(DECIDER.fast_interval_s),
    "DWD_CONFIRM_PERIOD": format_duration(DECIDER.confirm_period_s),
    "DWD_RECOVERY_PERIOD": format_duration(DECIDER.recovery_period_s),
    "DWD_FAILURE_FRACTION": str(DECIDER.failure_fraction),
    "DWD_RECOVERY_FRACTION": str(DECIDER.recovery_fraction),
    # Not the default: a node younger than the default grace is no candidate, and every run
    # here creates its nodes minutes before.
    "DWD_NODE_GRACE": "0s",
    "DWD_LOG_LEVEL": "warning",
}


def status(port: int) -> dict[str, Any]:
    with httpx.Client(trust_env=False, timeout=10) as http:
        targets: list[dict[str, Any]] = http.get(f"http://127.0.0.1:{port}/status").json()["targets"]
        return targets[0] if targets else {}


def watch_status(
    port: int, seconds: float, until: Callable[[dict[str, Any]], bool] | None = None
) -> list[dict[str, Any]]:
    """The target's /status every second for ``seconds`` or until ``until``."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(s := status(port))
        if until is not None and until(s):
            break
        time.sleep(1.0)
    return seen


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

    def start_aggregator(self, env: Mapping[str, str] | None = None) -> None:
        self.port = free_port()
        self.agg = self.shoot.start_aggregator(
            {
                **DEFAULTS,
                "DWD_METRICS_ADDR": f"127.0.0.1:{self.port}",
                "DWD_SHOOT_KUBECONFIG": str(self.kubeconfig),
                **(env or {}),
            }
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
    mine = run.audit.since(mark)
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
        mine = run.audit.since(mark)
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
    mine = run.audit.since(mark)
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


def _healed(run: Run) -> None:
    run.fleet.resume()
    wait_for(lambda: status(run.port).get("stale") == 0, 30, "no stale lease after resuming", every_s=0.5)


def _fractions(run: Run, cut: Sequence[str], expected: float, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """The cut's true fraction, the sample's, and the most the aggregator reported."""
    return {
        "true_fraction": round(len(cut) / len(run.names), 3),
        "sample_fraction_expected": round(expected, 3),
        "max_fraction_reported": round(max(s.get("fraction", 0.0) for s in seen), 3),
    }


def must_not_scale(run: Run, sampler: Sampler, cut: Sequence[str], watch_s: float) -> dict[str, Any]:
    expected = run.expected(cut)
    t0 = time.monotonic()
    run.fleet.silence(cut)
    seen = watch_status(run.port, watch_s)
    down = sampler.first(lambda s: any(v == 0 for v in s.replicas.values()), after=t0)
    _healed(run)
    return {
        **_fractions(run, cut, expected, seen),
        "phases": sorted({s.get("phase") for s in seen}),
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
        **_fractions(run, cut, expected, seen),
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
        _healed(run)
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
    run.start_aggregator({"DWD_WRITE_BUDGET": "1000000"})
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
