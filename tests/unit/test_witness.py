"""The second witness: kubelet leases overrule agents that fail on a working path.

Pure rules first (aggregator/decide/witness.py), then the Target tick by tick in the fake world,
where ``World.agents_failing`` are agents that fail while their node's path works (403, a
broken webhook, OOM) and ``World.alive`` the nodes whose path works at all: a real cut
silences the kubelet with the agent.
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregator.act.interlocks import Interlock
from aggregator.decide.witness import kubelet_says, witness
from aggregator.model.observed import (
    KUBELET_JITTER,
    KUBELET_LEASE_DURATION_S,
    KUBELET_RENEW_FRACTION,
    NODE_LEASE_NAMESPACE,
    KubeletObs,
    Readings,
    observe,
)
from aggregator.model.settings import DeciderSettings
from aggregator.model.verdict import Phase
from core.errors import Forbidden
from core.lease import leases_path
from testenv.kube.controllers import CONTROLLERS, DOWN
from tests.unit.fakekube import Rule, server_error
from tests.unit.world import World

T = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


MARGIN, SLACK = 3.0, 1.5
DUE = 10.0 * 1.04 + SLACK  # a kubelet's next renewal is due this long after its last, on our clock


@pytest.mark.parametrize(
    ("kubelet_s", "bracket", "read_at", "says", "due"),
    [
        # The node's clock places the renewal inside the bracket of our reads.
        (3.01, (95, 105), 101.0, "alive", 103.01 + DUE),  # more than the interval and a second after
        (3.0, (95, 105), 101.0, "pending", 103.0 + DUE),  # exactly the margin: its next renewal tells
        (-5.0, (90, 96), 101.0, "pending", 95.0 + DUE),  # renewed before the agent did
        (-5.0, (90, 96), 95.0 + DUE, "silent", 95.0 + DUE),  # a read sent when its next was due: missed
        (10.0, (105, 112), 110.0 + DUE, "silent", 110.0 + DUE),  # proved the path once, then missed
        (-30.0, (65, 72), 101.0, "silent", 70.0 + DUE),  # silent long before its agent
        (-6.0, (95, 105), 101.0, "pending", 95.0 + DUE),  # outside by less than the slack: clamped
        # The node's clock stepped between the two stamps: the bracket alone.
        (-3600.0, (105, 112), 113.0, "alive", 112.0 + DUE),  # after a read sent 5 s after the agent
        (3600.0, (95, 99), 101.0, "pending", 99.0 + DUE),  # not known to be after the agent
        (3600.0, (95, 99), 99.0 + DUE, "silent", 99.0 + DUE),
        # No lower end (the first read that saw the lease): never alive, due from when we saw it.
        (3.01, (-math.inf, 105), 106.0, "pending", 105.0 + DUE),
    ],
)
def test_a_kubelet_proves_the_path_after_its_agent_went_quiet_until_it_misses_a_renewal(
    kubelet_s: float, bracket: tuple[float, float], read_at: float, says: str, due: float
) -> None:
    """The agent's last renewal at T, seen by us at 100 (our clock); the kubelet's renewal at
    T + ``kubelet_s`` (the node's clock), not in a read sent at ``bracket[0]``, in one answered
    at ``bracket[1]``."""
    unseen_at, seen = bracket
    kubelet = KubeletObs(T + timedelta(seconds=kubelet_s), seen, unseen_at=unseen_at)
    got = kubelet_says(T, 100.0, kubelet, read_at, margin_s=MARGIN, slack_s=SLACK)
    assert got == pytest.approx((says, due))


def test_a_bracket_wider_than_the_reads_interval_is_not_narrowed_by_the_nodes_clock() -> None:
    """The reads stopped for 40 s (the shoot refused us) while the node's clock stepped back
    30 s: the stepped time falls inside the wide bracket, and would make the kubelet overdue."""
    kubelet = KubeletObs(T + timedelta(seconds=-20), 110.0, unseen_at=70.0)  # renewed at ~108
    trusting = kubelet_says(T, 100.0, kubelet, 110.0, margin_s=MARGIN, slack_s=SLACK)
    assert trusting == pytest.approx(("silent", 80.0 + DUE))
    says = kubelet_says(T, 100.0, kubelet, 110.0, margin_s=MARGIN, slack_s=SLACK, bracket_s=11.5)
    assert says == pytest.approx(("pending", 110.0 + DUE))


def test_a_kubelet_lease_of_another_duration_is_due_at_a_quarter_of_it() -> None:
    kubelet = KubeletObs(T, 100.0, interval_s=60 * 0.25, unseen_at=95.0)
    assert kubelet_says(T, 100.0, kubelet, 101.0, margin_s=MARGIN, slack_s=SLACK)[1] == pytest.approx(
        100.0 + 15.0 * 1.04 + SLACK
    )


def test_no_kubelet_lease_or_no_renewal_in_it_leaves_the_agents_verdict() -> None:
    assert kubelet_says(T, 100.0, None, 101.0, margin_s=MARGIN, slack_s=SLACK)[0] == "silent"
    none = KubeletObs(None, 100.0, unseen_at=95.0)
    assert kubelet_says(T, 100.0, none, 101.0, margin_s=MARGIN, slack_s=SLACK)[0] == "silent"
    # An agent renewal that cannot be read: the bracket alone.
    kubelet = KubeletObs(T + timedelta(seconds=10), 110.0, unseen_at=104.0)
    assert kubelet_says(None, 100.0, kubelet, 111.0, margin_s=MARGIN, slack_s=SLACK)[0] == "alive"


def test_each_renewal_is_bracketed_by_the_reads_that_did_not_and_did_show_it() -> None:
    lease = {"metadata": {"name": "a"}, "spec": {"renewTime": "2026-12-01T12:00:00.000000Z"}}
    first = observe([lease], Readings(), 10.0)
    assert (first["a"].seen_renewed_mono, first["a"].unseen_at) == (10.0, -math.inf)
    same = observe([lease], Readings(first, 9.0), 20.0)
    assert same["a"] == first["a"]  # not renewed: the bracket of the renewal it shows stays
    renewed = {"metadata": {"name": "a"}, "spec": {"renewTime": "2026-12-01T12:00:10.000000Z"}}
    later = observe([renewed], Readings(same, 19.0), 30.0)
    assert (later["a"].seen_renewed_mono, later["a"].unseen_at) == (30.0, 19.0)
    # A lease the last read did not list was created after it.
    assert observe([lease], Readings({}, 19.0), 30.0)["a"].unseen_at == 19.0


def test_before_any_read_every_stale_node_waits_a_kubelet_interval_and_the_margin() -> None:
    said = witness({"a": (T, 100.0)}, Readings(), margin_s=MARGIN, slack_s=SLACK)
    assert said.pending == {"a": pytest.approx(100.0 + MARGIN + DUE)}
    assert said.silent_by(frozenset({"a"}), 100.0 + MARGIN + DUE - 0.01) == frozenset()
    assert said.silent_by(frozenset({"a"}), 100.0 + MARGIN + DUE) == {"a"}
    # Kubelet leases we may not read: the agents' verdict stands.
    assert witness({"a": (T, 100.0)}, None, margin_s=MARGIN, slack_s=SLACK).silent_by(
        frozenset({"a"}), 0
    ) == {"a"}


@pytest.mark.parametrize("skew_s", [0.0, 3600.0, -86400.0])
async def test_agents_failing_on_a_working_path_never_scale_a_shoot_down(skew_s: float) -> None:
    """Every agent's renewals answered 403 while every kubelet keeps renewing: nothing may be
    scaled down, whatever the nodes' clocks say (agent and kubelet share one)."""
    w = World()
    w.skew_s = dict.fromkeys(w.names, skew_s)
    await w.settle()
    mark = len(w.seed.writes)
    w.agents_failing = set(w.names)
    await w.run(120)
    assert not w.ever_scaled_down(), w.target.status.reason
    assert w.target.status.path_alive == frozenset(w.names)
    assert w.target.snapshot()["agent_silent_path_alive"] == sorted(w.names)
    assert w.target.metrics.path_alive.get(target="shoot") == 10
    reports = [b for m, p, b in w.seed.writes[mark:] if p.endswith("/events")]
    assert [b["reason"] for b in reports] == ["AgentsSilentPathAlive"]  # once, for the episode
    assert "403" in reports[0]["message"] and "10 node(s)" in reports[0]["message"]


@pytest.mark.parametrize("step_s", [-30.0, -3600.0, -86400.0, 30.0, 3600.0])
@pytest.mark.parametrize("after_s", [0.0, 5.0, 25.0])
async def test_node_clocks_that_step_while_the_agents_fail_on_a_working_path_lower_nothing(
    step_s: float, after_s: float
) -> None:
    """An NTP correction or a restored VM steps every node's clock ``after_s`` after its agent
    fell silent on a working path: the kubelets' later renewals carry earlier (or later) times
    than their agents' last ones. Judged by when we saw each lease change, nothing is lowered,
    and a real cut afterwards is still caught."""
    w = World()
    await w.settle()
    w.agents_failing = set(w.names)
    await w.run(after_s)
    w.skew_s = dict.fromkeys(w.names, step_s)
    await w.run(90)
    assert not w.ever_scaled_down(), w.target.status.reason
    w.alive -= set(w.names)
    await w.until(lambda: w.replicas() == DOWN, 40, "a real cut scaled down")


async def test_the_event_that_tells_of_silent_agents_never_holds_up_the_tick() -> None:
    """The Events wait in a queue of their own, up to a minute in a seed-wide outage: the tick
    that tells of silent agents must not wait with them, or it would act on interlocks that old."""
    w = World()
    await w.settle()
    hang = w.seed.hang = Rule("POST", "/events$", server_error)
    w.agents_failing = set(w.names)
    await asyncio.wait_for(w.run(60), timeout=30)
    assert hang.hits == 1  # told, and still waiting
    assert w.target.status.path_alive == frozenset(w.names)
    await w.target.scaler.close()


async def test_the_interlock_refuses_when_the_kubelets_renewed_after_the_agents() -> None:
    """The kubelets are read again right before the scale-down: agents that failed just now,
    between two reads of the kubelet leases, are still caught there."""
    w = World()
    await w.settle()
    w.agents_failing = set(w.names)
    w.target.parts.evidence.kubelets.read_at = float("inf")  # no read while confirming: only the interlock's
    refusals = []
    for _ in range(30):
        await w.step()
        if w.target.status.blocked is not None:
            refusals.append(w.target.status.blocked.interlock)
    assert Interlock.PATH_ALIVE in refusals
    assert not w.ever_scaled_down()


async def test_a_real_cut_waits_for_the_witness_at_most_until_the_kubelets_are_due() -> None:
    """Without kubelet leases the verdict comes a lease duration and the confirm period after
    the cut; with them, a kubelet that renewed just before the cut is pending until its next
    renewal is due (its interval, jitter and slack) and a read shows it missed. At the 8 s and
    4 s of before 2026-12-05 that was always sooner (12 s); at 6 s and 3 s it may not be."""
    took = {}
    for kubelets in (True, False):
        w = World()
        if not kubelets:
            w.kubelets = set()
        await w.settle()
        w.alive -= set(w.names[:7])  # the path breaks: agents and kubelets fall silent
        took[kubelets] = await w.until(lambda w=w: w.replicas() == DOWN, 40, "scaled down")
    d = DeciderSettings()
    due = KUBELET_LEASE_DURATION_S * KUBELET_RENEW_FRACTION * (1 + KUBELET_JITTER) + d.witness_slack_s
    assert took[False] <= d.lease_duration_s + d.confirm_period_s + 2 * d.tick_s, took
    assert took[False] <= took[True] <= max(took[False], due + d.tick_s), took


async def test_scaled_down_the_kubelets_bring_the_controllers_back_while_the_agents_stay_silent() -> None:
    w = World()
    await w.settle()
    await w.outage()
    mark = len(w.seed.writes)
    w.agents_failing = set(w.names[:7])  # the path heals, but those agents stay broken
    w.alive |= set(w.names)
    took = await w.until(w.restored, 90, "restored by the kubelets' word")
    # The next kubelet read (every 10 s), its renewals, the recovery period; then MCM's 30 s.
    assert took <= 10 + 10 + 10 + 30 + 5, took
    ups = [
        b["message"]
        for m, p, b in w.seed.writes[mark:]
        if p.endswith("/events") and b["reason"] == "ScaledUp"
    ]
    assert ups and "agents fail" in ups[0], ups


async def test_a_kubelet_that_falls_silent_too_stops_vouching() -> None:
    """Agents fail first (no scale-down: their kubelets renew); then the path really breaks.
    Once a read shows the kubelets missed their next renewal, the shoot is scaled down."""
    w = World()
    await w.settle()
    w.agents_failing = set(w.names)
    await w.run(30)
    assert not w.ever_scaled_down()
    w.alive -= set(w.names[:7])
    took = await w.until(lambda: w.replicas() == DOWN, 60, "scaled down after the real cut")
    assert took <= 10 + 30 + 4 + 5, took


async def test_unreadable_kubelet_leases_leave_protection_as_it_was() -> None:
    """A shoot whose aggregator may not read kube-node-lease (RBAC not updated yet): the agents'
    verdict stands, and the reason is on the status page."""
    w = World()
    w.shoot.fail("GET", leases_path(NODE_LEASE_NAMESPACE) + "$", lambda: Forbidden(403, "Forbidden", "no"))
    await w.settle()
    w.alive -= set(w.names[:7])
    await w.until(lambda: w.replicas() == DOWN, 40, "scaled down")
    error = w.target.snapshot()["kubelet_leases_error"]
    assert "Forbidden" in error or "no" in w.target.parts.evidence.kubelets.error
    assert w.target.memory.phase is Phase.DOWN
    w.alive |= set(w.names)
    await w.until(lambda: w.replicas() == CONTROLLERS, 60, "restored")


async def test_the_interlock_reads_the_kubelets_beside_the_confirming_list_not_after_it() -> None:
    """Read after the LIST, the kubelet leases' LIST added its own latency to every real
    scale-down (225-284 ms at 5000 nodes)."""
    w = World()
    await w.settle()
    inner = w.shoot.request
    in_flight = most = 0

    async def request(method: str, path: str, **kw: Any) -> dict[str, Any]:
        nonlocal in_flight, most
        if method != "GET" or not path.endswith("/leases"):
            return await inner(method, path, **kw)
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.02)
            return await inner(method, path, **kw)
        finally:
            in_flight -= 1

    w.shoot.request = request  # type: ignore[method-assign]  # counted, for this test
    refusal = await w.target.refusal()
    assert refusal is not None and refusal.interlock is Interlock.LIST_DISAGREES  # healthy
    assert most == 2, "the two LISTs ran one after the other"
