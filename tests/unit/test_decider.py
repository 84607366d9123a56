"""The decision, table-driven, to the millisecond: plain data in, verdict out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aggregator.decider import Action, LeaseObs, Memory, NodeObs, Params, Phase, candidates, decide

P = Params(
    lease_duration_s=8.0,
    node_grace_s=60.0,
    failure_fraction=0.6,
    recovery_fraction=0.4,
    confirm_period_s=4.0,
    recovery_period_s=10.0,
    min_candidates=2,
)
NOW = 1000.0


def cluster(n: int, stale: int, **node_kw: bool) -> tuple[dict[str, NodeObs], dict[str, LeaseObs]]:
    """n old nodes; the first ``stale`` were last seen renewed 9 s ago (> 8 s), the rest 1 s ago."""
    nodes = {f"n{i}": NodeObs(f"n{i}", created_mono=0.0, **node_kw) for i in range(n)}
    leases = {
        f"n{i}": LeaseObs(f"n{i}", renew_time="t", seen_renewed_mono=NOW - (9.0 if i < stale else 1.0))
        for i in range(n)
    }
    return nodes, leases


def healthy() -> Memory:
    return Memory(Phase.HEALTHY, 0.0)


@pytest.mark.parametrize(
    ("n", "stale", "phase", "since", "action", "next_phase"),
    [
        # healthy -> confirming exactly at the threshold, not below it
        (10, 6, Phase.HEALTHY, 0, Action.NONE, Phase.CONFIRMING),
        (10, 5, Phase.HEALTHY, 0, Action.NONE, Phase.HEALTHY),
        (5, 3, Phase.HEALTHY, 0, Action.NONE, Phase.CONFIRMING),  # 0.6 exactly
        # confirming: act only after the full confirm period
        (10, 7, Phase.CONFIRMING, NOW - 3.999, Action.NONE, Phase.CONFIRMING),
        (10, 7, Phase.CONFIRMING, NOW - 4.0, Action.SCALE_DOWN, Phase.DOWN),
        (10, 5, Phase.CONFIRMING, NOW - 100, Action.NONE, Phase.HEALTHY),
        # hysteresis: 0.5 is below the failure fraction but not below the recovery fraction
        (10, 5, Phase.DOWN, 0, Action.NONE, Phase.DOWN),
        (10, 4, Phase.DOWN, 0, Action.NONE, Phase.DOWN),  # 0.4 is not < 0.4
        (10, 3, Phase.DOWN, 0, Action.NONE, Phase.RECOVERING),
        (10, 3, Phase.RECOVERING, NOW - 9.999, Action.NONE, Phase.RECOVERING),
        (10, 3, Phase.RECOVERING, NOW - 10.0, Action.SCALE_UP, Phase.HEALTHY),
        (10, 4, Phase.RECOVERING, NOW - 100, Action.NONE, Phase.DOWN),
        # single candidate: never a verdict, whatever the phase
        (1, 1, Phase.HEALTHY, 0, Action.NONE, Phase.HEALTHY),
        (1, 1, Phase.CONFIRMING, NOW - 100, Action.NONE, Phase.CONFIRMING),
        (1, 0, Phase.DOWN, 0, Action.NONE, Phase.DOWN),
        # zero candidates: make sure the controllers run
        (0, 0, Phase.DOWN, 0, Action.SCALE_UP, Phase.HEALTHY),
        (0, 0, Phase.RECOVERING, 0, Action.SCALE_UP, Phase.HEALTHY),
        (0, 0, Phase.HEALTHY, 0, Action.NONE, Phase.HEALTHY),
        # starting: nothing is judged
        (10, 10, Phase.STARTING, 0, Action.NONE, Phase.STARTING),
    ],
)
def test_transitions(  # noqa: PLR0917 - one argument per table column
    n: int, stale: int, phase: Phase, since: float, action: Action, next_phase: Phase
) -> None:
    nodes, leases = cluster(n, stale)
    v = decide(nodes, leases, NOW, P, Memory(phase, since))
    assert (v.action, v.memory.phase) == (action, next_phase), v.reason
    assert (v.candidates, v.stale) == (n, stale)


def test_memory_keeps_its_since_while_the_phase_holds() -> None:
    nodes, leases = cluster(10, 7)
    v1 = decide(nodes, leases, NOW, P, healthy())
    assert v1.memory == Memory(Phase.CONFIRMING, NOW)
    v2 = decide(nodes, leases, NOW + 1, P, v1.memory)
    assert v2.memory is v1.memory


def test_staleness_is_exactly_the_lease_duration() -> None:
    nodes = {"a": NodeObs("a", 0.0), "b": NodeObs("b", 0.0)}
    leases = {
        "a": LeaseObs("a", "t", seen_renewed_mono=NOW - 8.0),
        "b": LeaseObs("b", "t", seen_renewed_mono=NOW - 7.999),
    }
    v = decide(nodes, leases, NOW, P, healthy())
    assert v.stale_nodes == ("a",)


@pytest.mark.parametrize(
    ("change", "counted"),
    [
        ({"deleting": True}, False),
        ({"ignored": True}, False),
        ({"unhealthy": True}, False),
        ({"created_mono": NOW - 59.0}, False),  # younger than the node grace
        ({"created_mono": NOW - 60.0}, True),
    ],
)
def test_node_filters(change: dict[str, object], counted: bool) -> None:
    nodes, leases = cluster(3, 0)
    nodes["n0"] = replace(nodes["n0"], **change)  # type: ignore[arg-type]
    assert ("n0" in candidates(nodes, leases, NOW, P)) is counted


def test_lease_filters() -> None:
    nodes, leases = cluster(4, 4)
    leases["n0"] = replace(leases["n0"], released=True)
    leases["n1"] = replace(leases["n1"], renew_time=None)  # never renewed
    del leases["n2"]  # not provisioned yet
    assert set(candidates(nodes, leases, NOW, P)) == {"n3"}


def test_all_agents_released_means_no_verdict_and_controllers_up() -> None:
    nodes, leases = cluster(10, 10)
    leases = {k: replace(v, released=True) for k, v in leases.items()}
    assert decide(nodes, leases, NOW, P, healthy()).action is Action.NONE
    assert decide(nodes, leases, NOW, P, Memory(Phase.DOWN, 0)).action is Action.SCALE_UP


def test_a_node_that_leaves_during_an_outage_changes_the_fraction() -> None:
    nodes, leases = cluster(10, 6)
    confirming = decide(nodes, leases, NOW, P, healthy()).memory
    del nodes["n0"]  # 5/9 < 0.6: no longer a quorum
    v = decide(nodes, leases, NOW + 5, P, confirming)
    assert (v.action, v.memory.phase, v.stale, v.candidates) == (Action.NONE, Phase.HEALTHY, 5, 9)


def test_a_node_that_joins_during_an_outage_is_not_counted_until_it_is_old_enough() -> None:
    nodes, leases = cluster(10, 7)
    down = Memory(Phase.DOWN, NOW - 30)
    nodes["new"] = NodeObs("new", created_mono=NOW - 5)
    leases["new"] = LeaseObs("new", "t", seen_renewed_mono=NOW)
    v = decide(nodes, leases, NOW, P, down)
    assert (v.candidates, v.stale, v.memory.phase) == (10, 7, Phase.DOWN)


def test_reason_says_what_and_why() -> None:
    nodes, leases = cluster(10, 7)
    v = decide(nodes, leases, NOW, P, Memory(Phase.CONFIRMING, NOW - 5))
    assert v.reason == "7/10 stale (70%) for 5.0s: quorum lost"
    assert v.fraction == pytest.approx(0.7)


def test_only_the_fast_sample_is_judged() -> None:
    nodes, leases = cluster(10, 7)
    v = decide(nodes, leases, NOW, P, healthy(), sample={"n5", "n6", "n7", "n8", "n9"})
    assert (v.candidates, v.stale) == (5, 2)
    assert decide(nodes, leases, NOW, P, healthy(), sample=None).candidates == 10


def test_a_node_whose_pace_just_changed_counts_once_it_renewed_since() -> None:
    nodes, leases = cluster(3, 0)
    leases["n0"] = replace(leases["n0"], seen_renewed_mono=NOW - 30, paced_since_mono=NOW - 1)
    assert "n0" not in candidates(nodes, leases, NOW, P)
    leases["n0"] = replace(leases["n0"], seen_renewed_mono=NOW)
    assert "n0" in candidates(nodes, leases, NOW, P)
