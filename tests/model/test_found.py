"""The counterexamples the model found in the product, each shrunk and kept as a named case
(docs/decision.md, "The model"): the rules hypothesis chose, in its order, then the quiet end
that checks every invariant."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.model.settings import Decider
from tests.model.machine import Model
from tests.model.mutants import MUTANTS, ROOT

KCM = "kube-controller-manager"
# The shipped defaults (aggregator/model/settings.py), as the model's drawn settings, with one
# candidate enough for a verdict, no node grace and a short blind limit.
_SHIPPED = Decider()
DEFAULTS: dict[str, Any] = {
    **{
        name: getattr(_SHIPPED, name)
        for name in (
            "fast_interval_s",
            "lease_duration_s",
            "failure_fraction",
            "recovery_fraction",
            "confirm_period_s",
            "recovery_period_s",
            "roll_allowance_s",
        )
    },
    "min_candidates": 1,
    "node_grace_s": 0.0,
    "blind_limit_s": 30.0,
}
# Short clocks, a confirm period of none: where a wrong "silent" acts at once.
SHORT: dict[str, Any] = {
    "fast_interval_s": 0.5,
    "lease_duration_s": 1.0,
    "failure_fraction": 0.5,
    "recovery_fraction": 0.2,
    "confirm_period_s": 0.0,
    "recovery_period_s": 0.0,
    "blind_limit_s": 10.0,
}


def test_a_record_whose_annotation_was_lost_before_a_restart_is_still_restored() -> None:
    """Held down by a cut, KCM loses our annotation (another writer) and both replicas are
    killed before the leader wrote it back: the new processes find our label alone. Before
    the label alone counted as our mark, KCM stayed at 0 on a healed shoot (I2)."""
    m = Model()
    m.start(drawn=DEFAULTS, nodes=3, seed=1)
    m.cut(then=30, which="all", offset=0)
    assert not any(m.world.replicas_now().values()), m.world.replicas_now()
    m.lose_record(then=0, name=KCM, what="annotation")
    m.crash(then=0, replica=0)
    m.crash(then=0, replica=1)
    m.heal(then=0)
    m.teardown()


def test_every_annotation_wiped_and_a_restart_still_restore_the_count_taken() -> None:
    """Found by ``make soak`` (2026-12-03, shrunk by hand from 52 steps): held down by a cut,
    KCM's annotations are all wiped (ours and dependency-watchdog's count beside it; our label
    stays), and both replicas are killed before the leader wrote them back. The new processes
    found our label alone and no count anywhere: KCM came back at 1 (dependency-watchdog's
    fallback), not 3 (I2). Our label now carries the count."""
    m = Model()
    m.start(drawn=DEFAULTS, nodes=3, seed=1)
    m.cut(then=30, which="all", offset=0)
    assert not any(m.world.replicas_now().values()), m.world.replicas_now()
    m.lose_record(then=0, name=KCM, what="annotations")
    m.crash(then=0, replica=0)
    m.crash(then=0, replica=1)
    m.heal(then=0)
    m.teardown()


def test_a_record_left_as_our_label_alone_is_handed_back_to_a_migrating_shoots_owner() -> None:
    """Found by ``make soak`` (2026-12-03, 52 steps, shrunk by hand): held down, an operator
    raises KCM to 5 and another writer removes our annotation (our label stays); gardenlet
    migrates the shoot (its controllers to 0). The sweep handed back only the dependents whose
    annotation it found: KCM kept our label and dependency-watchdog's marks, so gardenlet's
    restore skipped it as protected, and our blind limit later raised it to our 3 instead of
    the owner's 5 (I2). A label alone is a record of ours to hand back too."""
    m = Model()
    m.start(drawn=DEFAULTS, nodes=3, seed=1)
    m.cut(then=30, which="all", offset=0)
    m.operator_scale(then=0, name=KCM, replicas=5)
    m.lose_record(then=0, name=KCM, what="annotation")
    m.gardenlet(then=30, to="migrating")
    m.teardown()


def test_a_clock_step_hidden_in_a_gap_of_the_kubelet_reads_makes_no_kubelet_silent() -> None:
    """Found by the model (2026-12-04, shrunk by hand from 33 steps): every agent killed on a
    working path, a quorum of node clocks stepped back 30 s, then the shoot refused the
    aggregator for 30 s (its token revoked). The first kubelet read after that brackets each
    renewal between itself and the read before the gap, 40 s wide: the stepped renewal times
    fell inside it, so the node's clock was trusted and every kubelet looked overdue (I1).
    A bracket wider than the reads' interval is no longer narrowed by the node's clock."""
    m = Model()
    m.start(drawn=DEFAULTS | SHORT, nodes=5, seed=1)
    m.agents_fail(then=30, how="killed", offset=0, which="all")
    m.clock_step(then=0, dt=-30.0, offset=0, which="all")
    m.token(then=30, ok=False)
    m.token(then=13, ok=True)
    m.teardown()


def test_broken_machines_and_a_slow_roll_of_every_other_agent_lower_nothing() -> None:
    """Issue 56: 2 of 10 machines broken (agent and kubelet silent), the other agents rolled at
    once with successors two lease durations slow. A release that left the verdict after a
    lease duration read 2/2 stale, and KCM, MCM and CA went to 0 while 8 kubelets renewed (I1);
    without the second witness the same."""
    for refused in (False, True):
        m = Model()
        m.start(drawn=DEFAULTS, nodes=10, seed=1)
        m.witness_refused(then=13, on=refused)
        m.machines_break(then=0, which="one", offset=0)
        m.machines_break(then=13, which="one", offset=1)
        m.roll(then=30, which="all", offset=2, max_unavailable=1.0, slow="lease", release_both=True)
        assert all(m.world.replicas_now().values()), m.world.replicas_now()
        m.teardown()


def test_a_sub_quorum_zone_cut_during_a_roll_lowers_nothing() -> None:
    """Issue 56: half the nodes cut (a zone, below the quorum by design), the other half's
    agents rolled a quarter at a time with slow successors: 5/7 once the released leases left,
    scaled down and then held by the recovery fraction (I1)."""
    m = Model()
    m.start(drawn=DEFAULTS, nodes=10, seed=1)
    m.cut(then=13, which="sub-quorum", offset=0)
    m.roll(then=30, which="all", offset=5, max_unavailable=0.25, slow="lease", release_both=True)
    m.wait(seconds=40)
    assert all(m.world.replicas_now().values()), m.world.replicas_now()
    m.teardown()


def test_a_roll_of_old_agents_during_the_move_lowers_nothing_without_the_second_witness() -> None:
    """Issue 56: during a move from the first layout, agents of 0.2.0 release only their lease of
    ours; the old layout's, renewed just after it, is the one judged. With the kubelets' leases
    refused, a slow roll read as every node stale (I1)."""
    m = Model()
    m.start(drawn=DEFAULTS, nodes=6, seed=1)
    m.move(then=13, on=True)
    m.witness_refused(then=13, on=True)
    m.roll(then=30, which="all", offset=0, max_unavailable=1.0, slow="allowance", release_both=False)
    m.wait(seconds=21)
    assert all(m.world.replicas_now().values()), m.world.replicas_now()
    m.teardown()


@pytest.mark.parametrize("max_unavailable", [1.0, 0.5, 0.25, 0.1])
def test_a_cut_as_the_agents_roll_is_scaled_down_at_worst_past_the_roll_allowance(
    max_unavailable: float,
) -> None:
    """The worst case of a release never counted (docs/decision.md, "A lease its agent
    released"): every node cut as the roll begins, no successor able to renew. Where no more
    than 1 - the failure fraction roll at once, the rest make the quorum as outside a roll;
    above, the released wait the roll allowance for their silent kubelets."""
    m = Model()
    m.start(drawn=DEFAULTS | {"min_candidates": 2}, nodes=10, seed=1)
    w, p = m.world, m.world.p
    m.roll(
        then=0, which="all", offset=0, max_unavailable=max_unavailable, slow="allowance", release_both=True
    )
    m.run(w.step())  # the first batch stops, releasing its leases
    for node in w.nodes.values():
        node.path = False
    start = w.clock()
    while w.clock() - start < 120 and w.replicas_now()[KCM] > 0:
        m.run(w.step())
    took = w.clock() - start
    print(f"maxUnavailable {max_unavailable:g}: cut as the roll began, KCM at 0 after {took:.1f}s")
    quick = p.lease_duration_s + p.confirm_period_s + p.witness_margin_s + 10.4 + p.witness_slack_s + 5
    bound = p.roll_allowance_s + p.confirm_period_s + 4 * p.tick_s if max_unavailable > 0.4 else quick
    assert w.replicas_now()[KCM] == 0 and took <= bound, f"{took:.1f}s, bound {bound:.1f}s"
    m.teardown()


def test_every_mutant_still_finds_its_code_once() -> None:
    """A mutant whose code moved or changed would report itself stale when run, minutes in:
    said here instead, the moment the code moves."""
    stale = [
        f"{name}: {path}"
        for name, (path, old, _, _) in MUTANTS.items()
        if not (ROOT / path).exists() or (ROOT / path).read_text().count(old) != 1
    ]
    assert not stale, "mutants that no longer find their code once:\n" + "\n".join(stale)
