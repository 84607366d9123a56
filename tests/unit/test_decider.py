"""The decision, table-driven, to the millisecond: plain data in, verdict out."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from aggregator.act import budget
from aggregator.decide.decider import Look, decide, is_stale
from aggregator.decide.phases import blocked, take_over
from aggregator.model import eligibility
from aggregator.model.eligibility import candidates, skipped
from aggregator.model.objects import NodeView
from aggregator.model.observed import KubeletObs, LeaseObs, NodeObs, Readings, micro_time
from aggregator.model.settings import DeciderSettings
from aggregator.model.verdict import Desired, Memory, Phase, Verdict
from core.lease import LeaseView

P = DeciderSettings(
    lease_duration_s=8.0,
    node_grace_s=60.0,
    failure_fraction=0.6,
    recovery_fraction=0.4,
    confirm_period_s=4.0,
    recovery_period_s=10.0,
    min_candidates=2,
    fast_interval_s=2.0,
    blind_limit_s=120.0,
)
NOW = 1000.0
# The wall clock at our monotonic 0 (renewTimes are written on it).
T0 = 1_796_000_000.0
# The view has been fresh for longer than a lease duration: verdicts are possible.
WARM = NOW - 100.0


def judge(
    nodes: dict[str, NodeObs],
    leases: dict[str, LeaseObs],
    now: float,
    p: DeciderSettings,
    memory: Memory,
    **kw: object,
) -> Verdict:
    # ``kw``: any of decide's keywords, each test its own few.
    return decide(Look(nodes, leases, now, p, memory, **{"view_since": WARM, **kw}))  # type: ignore[arg-type]


def lease(name: str, seen_renewed_mono: float, **view_kw: object) -> LeaseObs:
    """A lease asked to renew every 2 s and seen renewed at ``seen_renewed_mono``."""
    # ``view_kw``: any of LeaseView's fields, each test its own few.
    view = LeaseView(name, **{"renew_time": "t", "interval_s": 2.0, **view_kw})  # type: ignore[arg-type]
    return LeaseObs(view, seen_renewed_mono)


def cluster(n: int, stale: int) -> tuple[dict[str, NodeObs], dict[str, LeaseObs]]:
    """n old nodes; the first ``stale`` were last seen renewed 9 s ago (> 8 s), the rest 1 s ago."""
    nodes = {f"n{i}": NodeObs(NodeView(f"n{i}"), created_mono=0.0) for i in range(n)}
    leases = {f"n{i}": lease(f"n{i}", NOW - (9.0 if i < stale else 1.0)) for i in range(n)}
    return nodes, leases


def healthy() -> Memory:
    return Memory(Phase.HEALTHY, 0.0)


@pytest.mark.parametrize(
    ("n", "stale", "phase", "since", "scale_down", "next_phase"),
    [
        # healthy -> confirming exactly at the threshold, not below it
        (10, 6, Phase.HEALTHY, 0, False, Phase.CONFIRMING),
        (10, 5, Phase.HEALTHY, 0, False, Phase.HEALTHY),
        (5, 3, Phase.HEALTHY, 0, False, Phase.CONFIRMING),  # 0.6 exactly
        # confirming: act only after the full confirm period
        (10, 7, Phase.CONFIRMING, NOW - 3.999, False, Phase.CONFIRMING),
        (10, 7, Phase.CONFIRMING, NOW - 4.0, True, Phase.DOWN),
        (10, 5, Phase.CONFIRMING, NOW - 100, False, Phase.HEALTHY),
        # hysteresis: 0.5 is below the failure fraction but not below the recovery fraction
        (10, 5, Phase.DOWN, 0, False, Phase.DOWN),
        (10, 4, Phase.DOWN, 0, False, Phase.DOWN),  # 0.4 is not < 0.4
        (10, 3, Phase.DOWN, 0, False, Phase.RECOVERING),
        (10, 3, Phase.RECOVERING, NOW - 9.999, False, Phase.RECOVERING),
        (10, 3, Phase.RECOVERING, NOW - 10.0, False, Phase.HEALTHY),
        (10, 4, Phase.RECOVERING, NOW - 100, False, Phase.DOWN),
        # too few candidates: no verdict; confirmation restarts, scaled down recovers
        (1, 1, Phase.HEALTHY, 0, False, Phase.HEALTHY),
        (1, 1, Phase.CONFIRMING, NOW - 100, False, Phase.HEALTHY),
        (1, 1, Phase.DOWN, 0, False, Phase.RECOVERING),
        (1, 1, Phase.RECOVERING, NOW - 9.999, False, Phase.RECOVERING),
        (1, 1, Phase.RECOVERING, NOW - 10.0, False, Phase.HEALTHY),
        (0, 0, Phase.DOWN, 0, False, Phase.RECOVERING),
        (0, 0, Phase.RECOVERING, NOW - 10.0, False, Phase.HEALTHY),
        (0, 0, Phase.HEALTHY, 0, False, Phase.HEALTHY),
        # starting: nothing happens until the record has been read
        (10, 10, Phase.STARTING, 0, False, Phase.STARTING),
    ],
)
def test_transitions(  # noqa: PLR0917 - one argument per table column
    n: int, stale: int, phase: Phase, since: float, scale_down: bool, next_phase: Phase
) -> None:
    nodes, leases = cluster(n, stale)
    v = judge(nodes, leases, NOW, P, Memory(phase, since))
    assert (v.scale_down, v.memory.phase) == (scale_down, next_phase), v.reason
    if phase is not Phase.STARTING:
        assert (v.candidates, v.stale) == (n, stale)


@pytest.mark.parametrize(
    ("records", "phase", "desired"),
    [
        (None, Phase.STARTING, None),
        (False, Phase.HEALTHY, Desired.RUNNING),
        (True, Phase.DOWN, Desired.HOLD),  # ours found: nothing moves until a fresh verdict
    ],
)
def test_a_start_resumes_from_the_record(records: bool | None, phase: Phase, desired: Desired | None) -> None:
    nodes, leases = cluster(10, 0)
    v = decide(Look(nodes, leases, NOW, P, Memory(Phase.STARTING, NOW), view_since=None, records=records))
    assert (v.memory.phase, v.desired, v.judged) == (phase, desired, False)


@pytest.mark.parametrize("view_since", [None, NOW - 7.999])
@pytest.mark.parametrize(
    ("phase", "next_phase"),
    [
        (Phase.HEALTHY, Phase.HEALTHY),
        (Phase.CONFIRMING, Phase.HEALTHY),  # confirmation starts again once the view is back
        (Phase.DOWN, Phase.DOWN),  # a KAPI restart does not flap the controllers
        (Phase.RECOVERING, Phase.DOWN),  # nor does recovery count on what it cannot see
    ],
)
def test_nothing_is_judged_without_a_lease_duration_of_fresh_view(
    view_since: float | None, phase: Phase, next_phase: Phase
) -> None:
    nodes, leases = cluster(10, 10)  # every lease looks stale: the view is what is wrong
    v = judge(nodes, leases, NOW, P, Memory(phase, NOW - 50), view_since=view_since)
    assert (v.memory.phase, v.scale_down, v.judged) == (next_phase, False, False), v.reason


def test_judging_starts_exactly_a_lease_duration_after_the_view_is_back() -> None:
    nodes, leases = cluster(10, 10)
    v = judge(nodes, leases, NOW, P, Memory(Phase.HEALTHY, 0), view_since=NOW - 8.0)
    assert (v.judged, v.memory.phase) == (True, Phase.CONFIRMING)


def test_blind_while_scaled_down_restores_after_the_blind_limit() -> None:
    nodes, leases = cluster(10, 10)
    memory = Memory(Phase.DOWN, NOW - 300)
    v = judge(nodes, leases, NOW, P, memory, view_since=None)
    assert (v.memory.phase, v.memory.blind_since) == (Phase.DOWN, NOW)
    v = judge(nodes, leases, NOW + 119.9, P, v.memory, view_since=None)
    assert v.memory.phase is Phase.DOWN
    v = judge(nodes, leases, NOW + 120, P, v.memory, view_since=None)
    assert (v.memory.phase, v.desired) == (Phase.HEALTHY, Desired.RUNNING)
    assert "restoring" in v.reason


def test_the_blind_clock_restarts_once_the_view_is_back() -> None:
    nodes, leases = cluster(10, 10)
    v = judge(nodes, leases, NOW, P, Memory(Phase.DOWN, 0), view_since=None)
    v = judge(nodes, leases, NOW + 100, P, v.memory)
    assert (v.memory.phase, v.memory.blind_since) == (Phase.DOWN, None)
    v = judge(nodes, leases, NOW + 101, P, v.memory, view_since=None)
    assert v.memory.blind_since == NOW + 101


def test_a_blocked_scale_down_confirms_again_from_now() -> None:
    nodes, leases = cluster(10, 7)
    v = judge(nodes, leases, NOW, P, Memory(Phase.CONFIRMING, NOW - 4))
    assert v.scale_down
    b = blocked(v, Memory(Phase.CONFIRMING, NOW - 4), NOW, "kapi_probe_failed")
    assert (b.memory, b.scale_down, b.desired) == (Memory(Phase.CONFIRMING, NOW), False, Desired.RUNNING)
    assert not judge(nodes, leases, NOW + 3.9, P, b.memory).scale_down
    assert judge(nodes, leases, NOW + 4, P, b.memory).scale_down


# A start that found records of ours: (candidates, stale, phase, since) -> (scale_down, phase, held).
# Held, it lowers nothing and raises nothing; a fresh verdict ends it either way.
@pytest.mark.parametrize(
    ("n", "stale", "phase", "since", "scale_down", "next_phase", "held"),
    [
        (10, 7, Phase.DOWN, 0, False, Phase.CONFIRMING, True),  # an outage: confirm it first
        (10, 7, Phase.CONFIRMING, NOW - 3.9, False, Phase.CONFIRMING, True),
        (10, 7, Phase.CONFIRMING, NOW - 4, True, Phase.DOWN, False),  # confirmed: lower the rest
        (10, 5, Phase.CONFIRMING, NOW - 4, False, Phase.DOWN, True),  # between the fractions: hold
        (10, 5, Phase.DOWN, 0, False, Phase.DOWN, True),
        (10, 0, Phase.CONFIRMING, NOW - 1, False, Phase.RECOVERING, True),
        (10, 0, Phase.DOWN, 0, False, Phase.RECOVERING, True),
        (10, 0, Phase.RECOVERING, NOW - 9.9, False, Phase.RECOVERING, True),
        (10, 0, Phase.RECOVERING, NOW - 10, False, Phase.HEALTHY, False),  # recovered: finish the scale-up
        (10, 7, Phase.RECOVERING, NOW - 5, False, Phase.CONFIRMING, True),
        (1, 0, Phase.CONFIRMING, NOW - 1, False, Phase.RECOVERING, True),  # no verdict: recover
        (1, 0, Phase.RECOVERING, NOW - 10, False, Phase.HEALTHY, False),
    ],
)
def test_a_held_start_moves_only_on_a_fresh_verdict(  # noqa: PLR0917 - one argument per table column
    n: int, stale: int, phase: Phase, since: float, scale_down: bool, next_phase: Phase, held: bool
) -> None:
    nodes, leases = cluster(n, stale)
    v = judge(nodes, leases, NOW, P, Memory(phase, since, held=True))
    assert (v.scale_down, v.memory.phase, v.memory.held) == (scale_down, next_phase, held), v.reason
    assert v.desired is (Desired.HOLD if held else Desired.SCALED_DOWN if scale_down else Desired.RUNNING)


def test_a_held_start_holds_while_blind_and_restores_after_the_blind_limit() -> None:
    nodes, leases = cluster(10, 10)
    v = judge(nodes, leases, NOW, P, Memory(Phase.CONFIRMING, NOW - 2, held=True), view_since=None)
    assert (v.memory.phase, v.memory.held, v.desired) == (Phase.DOWN, True, Desired.HOLD)
    v = judge(nodes, leases, NOW + 120, P, v.memory, view_since=None)
    assert (v.memory.phase, v.memory.held, v.desired) == (Phase.HEALTHY, False, Desired.RUNNING)


def test_a_blocked_scale_down_of_a_held_start_stays_held() -> None:
    nodes, leases = cluster(10, 7)
    before = Memory(Phase.CONFIRMING, NOW - 4, held=True)
    v = judge(nodes, leases, NOW, P, before)
    assert v.scale_down
    b = blocked(v, before, NOW, "kapi_probe_failed")
    assert (b.memory, b.desired) == (Memory(Phase.CONFIRMING, NOW, held=True), Desired.HOLD)


def test_a_new_leader_starts_from_the_record() -> None:
    assert take_over(NOW) == Memory(Phase.STARTING, NOW)


@pytest.mark.parametrize(
    ("phase", "desired"),
    [
        (Phase.STARTING, None),
        (Phase.HEALTHY, Desired.RUNNING),
        (Phase.CONFIRMING, Desired.RUNNING),
        (Phase.DOWN, Desired.SCALED_DOWN),
        (Phase.RECOVERING, Desired.SCALED_DOWN),
    ],
)
def test_the_phase_alone_says_what_the_dependents_should_be(phase: Phase, desired: Desired | None) -> None:
    assert Verdict(Memory(phase, 0), 0, 0, "").desired is desired


def test_memory_keeps_its_since_while_the_phase_holds() -> None:
    nodes, leases = cluster(10, 7)
    v1 = judge(nodes, leases, NOW, P, healthy())
    assert v1.memory == Memory(Phase.CONFIRMING, NOW)
    v2 = judge(nodes, leases, NOW + 1, P, v1.memory)
    assert v2.memory == v1.memory


def renewed(seen: list[float]) -> tuple[dict[str, NodeObs], dict[str, LeaseObs]]:
    """Old nodes whose agents were last seen renewed at ``seen`` (our clock)."""
    nodes = {f"n{i}": NodeObs(NodeView(f"n{i}"), created_mono=0.0) for i in range(len(seen))}
    return nodes, {f"n{i}": lease(f"n{i}", at) for i, at in enumerate(seen)}


@pytest.mark.parametrize(
    ("seen", "wake_at"),
    [
        # 4 stale of 10, and two more expire within the tick: the 6th at NOW + 0.7, not at the 5th
        ([NOW - 9] * 4 + [NOW - 7.8, NOW - 7.3, NOW - 7.1] + [NOW - 1] * 3, NOW + 0.7),
        # only one of the two needed expires within the tick: the next tick looks anyway
        ([NOW - 9] * 4 + [NOW - 7.8, NOW - 6.5] + [NOW - 1] * 4, None),
        # 3 of 5 reach 0.6 exactly: the third expiry, not a fourth
        ([NOW - 9] * 2 + [NOW - 7.5, NOW - 7.2, NOW - 1], NOW + 0.5),
        # all renewing: nothing to look for before the tick
        ([NOW - 1] * 10, None),
    ],
)
def test_a_healthy_verdict_looks_again_the_moment_the_quorum_would_be_lost(
    seen: list[float], wake_at: float | None
) -> None:
    """Detection waits for no tick: a cut is judged the moment enough leases expire."""
    nodes, leases = renewed(seen)
    v = judge(nodes, leases, NOW, P, healthy())
    assert v.memory.phase is Phase.HEALTHY
    assert v.wake_at == (None if wake_at is None else pytest.approx(wake_at))
    if wake_at is not None:
        assert judge(nodes, leases, wake_at, P, v.memory).memory == Memory(Phase.CONFIRMING, wake_at)
        assert judge(nodes, leases, wake_at - 0.001, P, v.memory).memory.phase is Phase.HEALTHY


@pytest.mark.parametrize(("since", "wake_at"), [(NOW - 3.4, NOW + 0.6), (NOW - 2.5, None), (NOW - 4.0, None)])
def test_a_confirming_verdict_looks_again_when_the_confirm_period_ends(
    since: float, wake_at: float | None
) -> None:
    nodes, leases = cluster(10, 7)
    v = judge(nodes, leases, NOW, P, Memory(Phase.CONFIRMING, since))
    assert v.wake_at == (None if wake_at is None else pytest.approx(wake_at))
    if wake_at is not None:
        assert judge(nodes, leases, wake_at, P, v.memory).scale_down


def test_staleness_is_exactly_the_lease_duration() -> None:
    assert is_stale(lease("a", NOW - 8.0), NOW, P)
    assert not is_stale(lease("b", NOW - 7.999), NOW, P)


@pytest.mark.parametrize(
    ("change", "counted"),
    [
        ({"deleting": True}, False),
        ({"ignored": True}, False),
        ({"true_conditions": frozenset({"DiskPressure"})}, False),
        ({"in_place_update": True}, False),
        ({"created_mono": NOW - 59.0}, False),  # younger than the node grace
        ({"created_mono": NOW - 60.0}, True),
    ],
)
def test_node_filters(change: dict[str, object], counted: bool) -> None:
    nodes, leases = cluster(3, 0)
    node = nodes["n0"]
    created_mono = change.pop("created_mono", node.created_mono)
    # ``change``: NodeView's fields, and the creation time apart.
    nodes["n0"] = NodeObs(replace(node.view, **change), created_mono)  # type: ignore[arg-type]
    assert ("n0" in candidates(nodes, leases, NOW, P)) is counted


def test_lease_filters() -> None:
    nodes, leases = cluster(4, 4)
    leases["n1"] = lease("n1", NOW - 9.0, renew_time=None)  # never renewed
    del leases["n2"]  # not provisioned yet
    assert set(candidates(nodes, leases, NOW, P)) == {"n0", "n3"}


def kubelets_at(names: dict[str, float], read_at: float) -> Readings:
    """Kubelet leases as a read sent at ``read_at`` shows them: each renewed at the given
    moment (our clock, bracketed by the read before), its renewTime on our own clock."""
    return Readings(
        {
            n: KubeletObs(micro_time(_stamp(t)), seen_renewed_mono=t, unseen_at=t - 0.5)
            for n, t in names.items()
        },
        read_at,
    )


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(T0 + t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def released_lease(name: str, seen: float) -> LeaseObs:
    return lease(name, seen, released=True, renew_time=_stamp(seen))


def test_a_released_lease_stays_judged_and_is_not_stale_within_the_roll_allowance() -> None:
    """An agent restarting (the DaemonSet rolled): its node stays in the verdict, and is not
    stale while its successor may still be starting, however long past a lease duration."""
    nodes, leases = cluster(4, 4)
    leases["n0"] = released_lease("n0", NOW - P.roll_allowance_s + 0.5)
    assert "n0" in candidates(nodes, leases, NOW, P)
    assert not is_stale(leases["n0"], NOW, P)
    assert "n0" not in skipped(nodes, leases, NOW, P)
    leases["n0"] = released_lease("n0", NOW - P.roll_allowance_s)
    assert is_stale(leases["n0"], NOW, P)
    assert "n0" in candidates(nodes, leases, NOW, P)


def test_broken_machines_and_a_slow_roll_of_the_rest_lower_nothing() -> None:
    """2 of 10 machines broken (agent and kubelet silent), the other 8 agents rolled at once,
    their successors slower than a lease duration: 2/10 stale, not 2/2."""
    nodes, leases = cluster(10, 2)
    for i in range(2, 10):
        leases[f"n{i}"] = released_lease(f"n{i}", NOW - 12.0)
    kubelets = kubelets_at({f"n{i}": NOW - 2.0 for i in range(2, 10)}, NOW - 0.1)
    v = judge(nodes, leases, NOW, P, healthy(), kubelets=kubelets)
    assert (v.memory.phase, v.candidates, v.stale) == (Phase.HEALTHY, 10, 2)
    v = judge(nodes, leases, NOW, P, healthy())  # the kubelets' leases refused (403)
    assert (v.memory.phase, v.candidates, v.stale) == (Phase.HEALTHY, 10, 2)


def test_a_sub_quorum_zone_cut_during_a_roll_stays_below_quorum() -> None:
    """11 of 20 nodes cut (55 %, under the 60 % quorum), 2 healthy agents rolling: 11/20."""
    nodes, leases = cluster(20, 11)
    for name in ("n18", "n19"):
        leases[name] = released_lease(name, NOW - 9.0)
    v = judge(nodes, leases, NOW, P, healthy(), kubelets=kubelets_at({}, NOW - 0.1))
    assert (v.memory.phase, v.candidates, v.stale) == (Phase.HEALTHY, 20, 11)


@pytest.mark.parametrize(
    ("kubelet", "stale"),
    [
        ("renewing", 0),  # its kubelet proves the path: the successor is slow, not cut off
        ("silent", 1),  # past the allowance and silent to the kubelet too: cut off
        ("unread", 0),  # no second witness: a release alone never counts towards a quorum
    ],
)
def test_past_the_roll_allowance_a_released_node_is_stale_only_when_its_kubelet_is_silent(
    kubelet: str, stale: int
) -> None:
    nodes, leases = cluster(2, 0)
    seen = NOW - P.roll_allowance_s - 1.0
    leases["n0"] = released_lease("n0", seen)
    readings = {
        "renewing": kubelets_at({"n0": NOW - 2.0}, NOW - 0.1),
        "silent": kubelets_at({"n0": seen - 1.0}, NOW - 0.1),
        "unread": None,
    }[kubelet]
    v = judge(nodes, leases, NOW, P, healthy(), kubelets=readings)
    assert (v.candidates, v.stale) == (2, stale)


@pytest.mark.parametrize(
    ("kubelet", "stale"),
    [
        ("silent", 1),  # a lease duration after the release, silent to its kubelet too: counted
        ("renewing", 0),  # the successor is starting: its kubelet proves the path
        ("no lease", 0),  # the witness cannot answer for it: the allowance, then its kubelet
        ("not read yet", 0),
    ],
)
def test_a_released_node_is_judged_by_its_kubelet_as_soon_as_the_kubelet_can_tell(
    kubelet: str, stale: int
) -> None:
    """Issue 64: a cut as the agents roll. Its agent released 10 s ago, well within the roll
    allowance; where the witness can answer, the node does not wait for the allowance."""
    nodes, leases = cluster(2, 0)
    seen = NOW - 10.0
    leases["n0"] = released_lease("n0", seen)
    readings = {
        "silent": kubelets_at({"n0": seen - 1.0}, NOW - 0.1),
        "renewing": kubelets_at({"n0": NOW - 2.0}, NOW - 0.1),
        "no lease": kubelets_at({}, NOW - 0.1),
        "not read yet": Readings({}, -math.inf),
    }[kubelet]
    v = judge(nodes, leases, NOW, P, healthy(), kubelets=readings)
    assert (v.candidates, v.stale) == (2, stale)
    # A release is not an agent failing: a roll is never told as "the path works, the agents fail".
    assert v.path_alive == frozenset() and "agents fail" not in v.reason


def test_a_cut_as_every_agent_releases_is_confirmed_by_the_kubelets_well_within_the_allowance() -> None:
    """Every agent released as the path broke (a roll at maxUnavailable 100 %): once a read
    after each kubelet's due renewal shows it silent, the verdict confirms, the allowance
    (30 s) long before it is over."""
    nodes, leases = cluster(10, 0)
    cut = NOW - 14.0
    leases = {k: released_lease(k, cut) for k in leases}
    silent = kubelets_at(dict.fromkeys(leases, cut - 1.0), NOW - 0.1)
    v = judge(nodes, leases, NOW, P, healthy(), kubelets=silent)
    assert (v.memory.phase, v.stale) == (Phase.CONFIRMING, 10)
    v = judge(nodes, leases, NOW + P.confirm_period_s, P, v.memory, kubelets=silent, confirming=True)
    assert v.scale_down and NOW + P.confirm_period_s - cut < P.roll_allowance_s


def test_every_agent_released_leaves_the_kubelets_to_judge() -> None:
    """An uninstall (or a roll of every agent): each node judged on its kubelet once the
    allowance has passed; renewing kubelets bring the controllers back."""
    nodes, leases = cluster(10, 10)
    leases = {k: released_lease(k, NOW - P.roll_allowance_s - 5.0) for k in leases}
    renewing = kubelets_at(dict.fromkeys(leases, NOW - 2.0), NOW - 0.1)
    assert judge(nodes, leases, NOW, P, healthy(), kubelets=renewing).memory.phase is Phase.HEALTHY
    v = judge(nodes, leases, NOW, P, Memory(Phase.DOWN, 0), kubelets=renewing)
    later = kubelets_at(dict.fromkeys(leases, NOW + P.recovery_period_s - 2.0), NOW + P.recovery_period_s)
    v = judge(nodes, leases, NOW + P.recovery_period_s, P, v.memory, kubelets=later)
    assert (v.memory.phase, v.desired, v.stale) == (Phase.HEALTHY, Desired.RUNNING, 0)


def test_a_node_that_leaves_during_an_outage_changes_the_fraction() -> None:
    nodes, leases = cluster(10, 6)
    confirming = judge(nodes, leases, NOW, P, healthy()).memory
    del nodes["n0"]  # 5/9 < 0.6: no longer a quorum
    v = judge(nodes, leases, NOW + 5, P, confirming)
    assert (v.scale_down, v.memory.phase, v.stale, v.candidates) == (False, Phase.HEALTHY, 5, 9)


def test_a_node_that_joins_during_an_outage_is_not_counted_until_it_is_old_enough() -> None:
    nodes, leases = cluster(10, 7)
    down = Memory(Phase.DOWN, NOW - 30)
    nodes["new"] = NodeObs(NodeView("new"), created_mono=NOW - 5)
    leases["new"] = lease("new", NOW)
    v = judge(nodes, leases, NOW, P, down)
    assert (v.candidates, v.stale, v.memory.phase) == (10, 7, Phase.DOWN)


def test_reason_says_what_and_why() -> None:
    nodes, leases = cluster(10, 7)
    v = judge(nodes, leases, NOW, P, Memory(Phase.CONFIRMING, NOW - 5))
    assert v.reason == "7/10 stale (70%) for 5.0s: quorum lost"
    assert v.fraction == pytest.approx(0.7)


def test_only_the_fast_sample_is_judged() -> None:
    nodes, leases = cluster(10, 7)
    v = judge(nodes, leases, NOW, P, healthy(), sample={"n5", "n6", "n7", "n8", "n9"})
    assert (v.candidates, v.stale) == (5, 2)
    assert judge(nodes, leases, NOW, P, healthy(), sample=None).candidates == 10


def test_a_node_whose_pace_just_changed_counts_once_it_renewed_since() -> None:
    nodes, leases = cluster(3, 0)
    leases["n0"] = replace(leases["n0"], seen_renewed_mono=NOW - 30, paced_since_mono=NOW - 1)
    assert "n0" not in candidates(nodes, leases, NOW, P)
    leases["n0"] = replace(leases["n0"], seen_renewed_mono=NOW - 1)  # the same moment is not "since"
    assert "n0" not in candidates(nodes, leases, NOW, P)
    leases["n0"] = replace(leases["n0"], seen_renewed_mono=NOW)
    assert "n0" in candidates(nodes, leases, NOW, P)


@pytest.mark.parametrize(("interval_s", "counted"), [(None, False), (60.0, False), (2.0, True), (1.0, True)])
def test_only_leases_asked_to_renew_fast_are_judged(interval_s: float | None, counted: bool) -> None:
    nodes, leases = cluster(3, 0)
    leases["n0"] = lease("n0", NOW - 1.0, interval_s=interval_s)
    assert ("n0" in candidates(nodes, leases, NOW, P)) is counted


def zoned_cluster(
    sizes: dict[str, int], silent: Callable[[str, str], bool]
) -> tuple[dict[str, NodeObs], dict[str, LeaseObs], frozenset[str]]:
    """Old nodes in zones, their fast sample as the budget draws it, and every node's lease:
    the sample's renew fast (a silent one last seen 9 s ago, the others 1 s ago), the rest
    every two minutes."""
    zones = {f"{z}-{i:05d}": z for z, n in sizes.items() for i in range(n)}
    nodes = {n: NodeObs(NodeView(n, zone=z), 0.0) for n, z in zones.items()}
    sample = budget.plan(zones, 2.0, 100.0, zones).fast
    leases = {
        n: lease(n, NOW - 9.0 if silent(n, zones[n]) else NOW - 1.0)
        if n in sample
        else lease(n, NOW - 60.0, interval_s=120.0)
        for n in zones
    }
    return nodes, leases, sample


@pytest.mark.parametrize(
    ("silent", "truth"),
    [
        (lambda n, z: z == "zone-c", 0.1),  # the small zone: overrepresented in the sample
        (lambda n, z: z != "zone-c", 0.9),
        (lambda n, z: z == "zone-b", 0.3),
        (lambda n, z: z == "zone-a" or (z == "zone-b" and int(n[-5:]) < 500), 0.7),
    ],
)
def test_a_sample_drawn_per_zone_estimates_the_clusters_stale_fraction(
    silent: Callable[[str, str], bool], truth: float
) -> None:
    """5000 nodes in zones of 3000, 1500 and 500. The small zone has more than its share of the
    sample (at least MIN_PER_ZONE): counted plainly, its outage alone would read as a quarter
    of the cluster. Weighted by zone it reads as what it is."""
    nodes, leases, sample = zoned_cluster({"zone-a": 3000, "zone-b": 1500, "zone-c": 500}, silent)
    v = judge(nodes, leases, NOW, replace(P, node_grace_s=0.0), Memory(Phase.HEALTHY, 0.0), sample=sample)
    assert v.judged and v.candidates == len(sample)
    assert v.fraction == pytest.approx(truth, abs=0.06)
    if truth == 0.1:
        assert v.stale / v.candidates > 0.2  # what the plain count would have said
    assert (v.memory.phase is Phase.CONFIRMING) == (truth >= 0.6)


def test_a_zone_is_weighted_by_the_nodes_the_verdict_stands_for_not_by_all_its_nodes() -> None:
    """Zone a: 280 nodes, 279 of them annotated ignore-node; zone b: 120 nodes. The sample holds
    a's one candidate and 20 of b. That one node stopping is one node in 121, not 70 % of the
    cluster (it scaled a healthy shoot down before)."""
    nodes = {
        f"a{i}": NodeObs(NodeView(f"a{i}", zone="a", ignored=i > 0), created_mono=0.0) for i in range(280)
    } | {f"b{i}": NodeObs(NodeView(f"b{i}", zone="b"), created_mono=0.0) for i in range(120)}
    leases = {name: lease(name, NOW - (9.0 if name == "a0" else 1.0)) for name in nodes}
    sample = {"a0", *(f"b{i}" for i in range(20))}
    v = judge(nodes, leases, NOW, P, healthy(), sample=sample)
    assert v.estimate is not None and v.estimate == pytest.approx(1 / 121)
    assert v.memory.phase is Phase.HEALTHY


@pytest.mark.parametrize(
    ("view", "lease_kw", "why"),
    [
        (NodeView("n", deleting=True), {}, "being deleted"),
        (NodeView("n", ignored=True), {}, "annotated ignore-node"),
        (NodeView("n", unmanaged=True), {}, "not managed by MCM"),
        (
            NodeView("n", true_conditions=frozenset({"DiskPressure"})),
            {},
            "an unhealthy condition (DiskPressure)",
        ),
        (NodeView("n", in_place_update=True), {}, "in-place update"),
        (NodeView("n"), None, "no lease yet"),
        (NodeView("n"), {"renew_time": None}, "its agent has not renewed yet"),
        (NodeView("n"), {}, None),
    ],
)
def test_each_node_left_out_says_which_rule_left_it_out(
    view: NodeView, lease_kw: dict[str, object] | None, why: str | None
) -> None:
    nodes = {"n": NodeObs(view, created_mono=0.0), "young": NodeObs(NodeView("young"), created_mono=NOW - 1)}
    leases = {"young": lease("young", NOW)}
    if lease_kw is not None:
        leases["n"] = lease("n", NOW, **lease_kw)
    out = skipped(nodes, leases, NOW, P)
    assert out.get("n") == why
    assert out["young"] == "younger than the node grace"
    assert ("n" in candidates(nodes, leases, NOW, P)) is (why is None)


def test_a_node_mcm_does_not_manage_is_read_from_its_annotation_whatever_its_value() -> None:
    meta = {"name": "n", "annotations": {"node.machine.sapcloud.io/not-managed-by-mcm": "false"}}
    assert NodeView.from_object({"metadata": meta}).unmanaged
    assert not NodeView.from_object({"metadata": {"name": "n"}}).unmanaged


def test_a_sampled_verdict_asks_each_node_its_rules_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eligibility is one pass: the sample's candidates, the zones' sizes its estimate weighs by,
    and the nodes left out, from one walk (before, the zones took a second walk of every node)."""
    asked: list[str] = []
    rules = eligibility.skip_reason

    def counting(node: NodeObs, *args: Any) -> str | None:
        asked.append(node.view.name)
        return rules(node, *args)

    monkeypatch.setattr(eligibility, "skip_reason", counting)
    nodes, leases = cluster(10, 2)
    v = judge(nodes, leases, NOW, P, healthy(), sample={"n0", "n1", "n2", "n3"})
    assert sorted(asked) == sorted(nodes)
    assert v.candidates == 4


def test_a_released_nodes_kubelet_writing_late_is_not_called_silent() -> None:
    """Found in review: a released node's kubelet is its only witness. One whose write lands a
    second after its stamp (a loaded node, during a roll) was silent to the first read after its
    stamp + interval + 1.5 s, and with a sub-quorum zone cut made a quorum. Released, its
    kubelet is given twice the slack."""
    nodes, leases = cluster(2, 0)
    leases["n0"] = released_lease("n0", NOW - 20.0)
    kubelet_renewed = NOW - 12.5  # its next renewal is due at NOW + 0.9 with the wider slack
    v = judge(nodes, leases, NOW, P, healthy(), kubelets=kubelets_at({"n0": kubelet_renewed}, NOW - 0.1))
    assert v.stale == 0
    assert v.wake_at == pytest.approx(kubelet_renewed + 10.4 + 2 * P.witness_slack_s)


def test_a_released_node_alive_to_its_kubelet_counts_once_that_kubelets_renewal_is_overdue() -> None:
    """Found in review: a released node whose kubelet renewed after the release stayed alive
    until the next regular read of the kubelets (every 10 s), so a cut as the agents rolled took
    up to 25 s. Once its kubelet's next renewal is due it counts, as a pending node does, and
    the verdict looks again at that moment; the interlocks' fresh read decides."""
    nodes, leases = cluster(2, 0)
    leases["n0"] = released_lease("n0", NOW - 20.0)
    readings = kubelets_at({"n0": NOW - 14.0}, NOW - 3.0)  # renewed 6 s after the release
    before = judge(nodes, leases, NOW - 2.0, P, healthy(), kubelets=readings)
    assert before.stale == 0 and before.wake_at == pytest.approx(NOW - 14.0 + 10.4 + 2 * P.witness_slack_s)
    assert judge(nodes, leases, NOW, P, healthy(), kubelets=readings).stale == 1
