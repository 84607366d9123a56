"""A DaemonSet roll of the agents on real kubelets while part of the shoot is really down
(issue 56). Ten nodes, each a real agent process and a real kubelet (kubemark's hollow node)
behind one load balancer; the aggregator as a process on the test clock (a 2 s lease). The
agents are rolled with a slow start: each SIGTERMed (it marks its lease released and exits 0),
its successor started three lease durations later, as a pod that pulls its image starts:

- two machines broken (agent SIGKILLed, kubelet stopped: stale to both witnesses), then the
  other eight agents rolled at once. 2 of 10 is no outage;
- five nodes cut off (agent and kubelet frozen by SIGSTOP: KAPI hears nothing from them, as
  from nodes behind a cut, without root), then two of the healthy five rolled. 5 of 10 is
  below the failure fraction (60 %).

Each roll comes once the down nodes are judged stale and their kubelets' next renewals are
overdue (both witnesses agree they are down). From the break until 10 s after every successor
renews, nothing may be lowered (the Sampler's record of KCM, MCM and CA), and the aggregator
may not enter scaled-down or recovering (the phase changes in its log). A rule that takes a
released lease out of the verdict while its successor starts leaves only the down nodes to
judge (2 of 2, 5 of 8 stale) and scales down a shoot whose kubelets all renew.

Run with ``pytest -s`` to see each look at the aggregator's /status (one a second): its
phase, the nodes it judges, how many of them are stale, how many a rule leaves out, and the
controllers' replicas at that moment, with the break, the roll and the successors between.

Both cases fail on the aggregator of f516672 (a released lease leaves the verdict once it is
a lease duration old) until issue 56's rule keeps a rolling node in the verdict.
"""

from __future__ import annotations

import bisect
import itertools
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import pytest

from aggregator.model.settings import DeciderSettings
from core.lease import RELEASED, parse_micro_time
from testenv.base.poller import Poller
from testenv.base.wait import wait_for
from testenv.kube.controllers import CA, CONTROLLERS, KCM, MCM
from testenv.kube.hollow import renewals
from testenv.kube.kubelet_identity import LEASE_DURATION_S as KUBELET_LEASE_DURATION_S
from testenv.worlds.shoot_world import MAX_GAP_S, Sample, Sampler
from tests.integration.nodesworld import LEASE_DURATION_S, NODES, NodesWorld

pytestmark = pytest.mark.integration

LOOK_EVERY_S = 1.0
# A successor pod that pulls its image starts seconds after its predecessor stopped: three
# lease durations of the test clock (at the 6 s default, a successor 18 s late).
START_DELAY_S = 3 * LEASE_DURATION_S
# Watched once every successor renews: a kubelet interval, so every kubelet renews once more.
AFTER_S = 10.0
# A kubelet's next renewal is overdue this long after its last: its interval (a quarter of its
# lease), its 4 % jitter and the aggregator's slack (docs/decision.md, "The second witness").
KUBELET_OVERDUE_S = KUBELET_LEASE_DURATION_S / 4 * 1.04 + DeciderSettings().witness_slack_s
LOWERING = ("scaled-down", "recovering")


@dataclass(frozen=True)
class Look:
    t: float  # time.monotonic() when the look began
    phase: str
    judging: bool
    candidates: int
    stale: int
    left_out: int  # the nodes a rule leaves out of the verdict (/status "skipped")


class Looks(Poller):
    """The aggregator's verdict from /status every LOOK_EVERY_S. A failed look is recorded, so
    a window it falls in is not called quiet."""

    def __init__(self, port: int) -> None:
        super().__init__("looks", LOOK_EVERY_S, fixed_rate=True)
        self.url = f"http://127.0.0.1:{port}/status"
        self.looks: list[Look] = []
        self.failures: list[tuple[float, str]] = []

    def step(self) -> None:
        started = time.monotonic()
        try:
            target = httpx.get(self.url, trust_env=False, timeout=LOOK_EVERY_S).json()["targets"][0]
            look = Look(
                started,
                str(target["phase"]),
                bool(target["judging"]),
                int(target["candidates"]),
                int(target["stale"]),
                len(target.get("skipped") or {}),
            )
        except (httpx.HTTPError, ValueError, LookupError, TypeError) as e:
            self.failures.append((started, f"{type(e).__name__}: {e}"))
            return
        self.looks.append(look)

    def latest(self) -> Look | None:
        return self.looks[-1] if self.looks else None

    def between(self, t0: float, t1: float) -> list[Look]:
        """The looks of [t0, t1], which must cover it as the Sampler's samples must (none, a
        failed one or a gap over MAX_GAP_S fails the test)."""
        looks = [x for x in self.looks if t0 <= x.t <= t1]
        failed = [why for t, why in self.failures if t0 <= t <= t1]
        assert looks, "no look at /status in the window"
        assert not failed, f"{len(failed)} looks at /status failed in the window, first: {failed[0]}"
        gap = max(b - a for a, b in itertools.pairwise([t0, *(x.t for x in looks), t1]))
        assert gap <= MAX_GAP_S, f"no look at /status for {gap:.1f}s of the window"
        return looks


@dataclass
class Watch:
    """The three records of a case, from the break to its end: the controllers' replicas
    (the Sampler, every 0.1 s), the aggregator's verdict (its /status, every second) and its
    phase changes (its log); and what the case did when."""

    w: NodesWorld
    sampler: Sampler
    looks: Looks
    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)
    end: float = float("inf")
    marks: list[tuple[float, str]] = field(default_factory=list)

    @classmethod
    def of(cls, w: NodesWorld) -> Watch:
        sampler, looks = w.shoot.sampler(), Looks(w.metrics_port)
        looks.start()
        wait_for(
            lambda: sampler.latest() and (x := looks.latest()) and x.judging and x.stale == 0,
            10,
            "a first sample, and a look at the aggregator judging every node fresh",
        )
        return cls(w, sampler, looks)

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic(), what))

    def stop(self) -> None:
        self.end = min(self.end, time.monotonic())
        self.looks.stop()

    def show(self, title: str) -> None:
        samples = self.sampler.between(self.t0, self.end)
        at = [s.t for s in samples]
        rows = [(t, f"  -- {t - self.t0:+6.1f}s  {what}") for t, what in self.marks]
        for x in self.looks.looks:
            if self.t0 <= x.t <= self.end:
                sample = samples[max(0, bisect.bisect_right(at, x.t) - 1)]
                rows.append((x.t, _row(x, sample, self.t0)))
        print(f"\n{title}\n{'t':>9}  {'phase':<12} judged stale left-out   KCM MCM CA")
        for _, line in sorted(rows):
            print(line)

    def assert_nothing_lowered(self) -> None:
        samples = self.sampler.between(self.t0, self.end)
        looks = self.looks.between(self.t0, self.end)
        low = next((s for s in samples if any(s.replicas[n] < r for n, r in CONTROLLERS.items())), None)
        assert low is None, f"lowered at {low.t - self.t0:+.1f}s: {low.replicas}"
        entered = [p for p in self.w.phase_changes() if p.at >= self.wall0 and p.phase in LOWERING]
        assert not entered, f"{entered[0].phase} at {entered[0].at - self.wall0:+.1f}s: {entered[0].reason}"
        print(
            f"nothing lowered: {len(samples)} samples of the controllers, {len(looks)} looks, "
            f"phases {sorted({x.phase for x in looks})}"
        )


def _row(x: Look, sample: Sample, t0: float) -> str:
    replicas = " ".join(f"{sample.replicas[n]:>3}" for n in (KCM, MCM, CA))
    verdict = "" if x.judging else "   no verdict"
    counts = f"{x.candidates:>6} {x.stale:>5} {x.left_out:>8}"
    return f"{x.t - t0:+8.1f}s  {x.phase:<12} {counts}   {replicas}{verdict}"


def break_machine(w: NodesWorld, node: str) -> None:
    """A machine gone: its agent SIGKILLed (its lease is not released), its kubelet stopped."""
    i = NODES.index(node)
    w.procs[i].kill()
    w.kubelets[i].stop()


def cut_off(w: NodesWorld, node: str) -> None:
    """A node behind a cut, as KAPI sees it: its agent and its kubelet frozen (SIGSTOP), their
    connections open and silent."""
    i = NODES.index(node)
    w.procs[i].popen.send_signal(signal.SIGSTOP)
    w.kubelets[i].pause()


def judged_down(watch: Watch, down: list[str]) -> None:
    """Wait until the aggregator judges ``down`` stale, healthy otherwise, and their kubelets'
    next renewals are overdue: from then on both witnesses say they are down."""
    wait_for(
        lambda: (x := watch.looks.latest()) and x.judging and x.stale == len(down) and x.phase == "healthy",
        20,
        f"{len(down)} nodes judged stale",
    )
    watch.mark(f"{len(down)} nodes judged stale")

    def overdue() -> bool:
        renewed = renewals(watch.w.shoot.shoot_admin, down)
        return len(renewed) == len(down) and time.time() - max(renewed.values()) > KUBELET_OVERDUE_S

    wait_for(overdue, KUBELET_OVERDUE_S + 5, "their kubelets' next renewals overdue", every_s=0.5)
    watch.mark(f"their kubelets' renewals overdue ({KUBELET_OVERDUE_S:.1f}s since the last)")


def roll(watch: Watch, rolled: list[str]) -> None:
    """The DaemonSet rolled over ``rolled`` at once: each agent SIGTERMed (it releases its lease
    and exits 0), each successor started START_DELAY_S later; returns once every successor
    renews."""
    w = watch.w
    old = [w.procs[NODES.index(n)] for n in rolled]
    started = time.monotonic()
    for p in old:
        p.popen.send_signal(signal.SIGTERM)
    watch.mark(f"{len(rolled)} agents SIGTERMed")
    assert [p.wait(5) for p in old] == [0] * len(old), "an agent did not exit 0 on SIGTERM"
    assert all("lease_released" in p.names() for p in old), "an agent did not release its lease"
    time.sleep(max(0.0, started + START_DELAY_S - time.monotonic()))
    since = datetime.now(UTC)
    watch.mark(f"{len(rolled)} successors starting, {START_DELAY_S:g}s after the SIGTERM")
    for n in rolled:
        w.procs[NODES.index(n)] = w.start_agent(n)

    def renewing() -> bool:
        leases = w.shoot.leases()
        return all(
            (renew := leases[n]["spec"].get("renewTime")) is not None
            and parse_micro_time(renew) > since
            and (leases[n]["metadata"].get("annotations") or {}).get(RELEASED) != "true"
            for n in rolled
        )

    wait_for(renewing, 30, "every successor renewing", every_s=0.2)
    watch.mark("every successor renewed its lease")
    time.sleep(AFTER_S)


TAKE_DOWN = {"broken": break_machine, "cut off": cut_off}


def roll_while_down(w: NodesWorld, title: str, down: list[str], rolled: list[str], how: str) -> None:
    """``down`` taken down (``TAKE_DOWN[how]``) and judged so, ``rolled`` rolled, and the
    records shown and checked."""
    watch = Watch.of(w)
    try:
        for node in down:
            TAKE_DOWN[how](w, node)
        watch.mark(f"{len(down)} nodes {how}: {', '.join(down)}")
        judged_down(watch, down)
        roll(watch, rolled)
    finally:
        watch.stop()
    watch.show(title)
    watch.assert_nothing_lowered()


@pytest.mark.timeout(180)
def test_agents_rolled_at_once_while_two_machines_are_broken_lower_nothing(real_nodes: NodesWorld) -> None:
    w = real_nodes.start()
    roll_while_down(
        w, "two machines broken, the other eight agents rolled at once", NODES[:2], NODES[2:], "broken"
    )


@pytest.mark.timeout(180)
def test_agents_rolled_during_a_cut_below_the_failure_fraction_lower_nothing(real_nodes: NodesWorld) -> None:
    w = real_nodes.start()
    roll_while_down(
        w, "five of ten nodes cut off, two of the others rolled", NODES[:5], NODES[5:7], "cut off"
    )
