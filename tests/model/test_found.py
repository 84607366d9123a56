"""The counterexamples the model found in the product, each shrunk and kept as a named case
(docs/decision.md, "The model"): the rules hypothesis chose, in its order, then the quiet end
that checks every invariant."""

from __future__ import annotations

from typing import Any

from tests.model.machine import Model
from tests.model.mutants import MUTANTS, ROOT

KCM = "kube-controller-manager"
# The shipped defaults (aggregator/model/settings.py), as the model's drawn settings.
DEFAULTS: dict[str, Any] = {
    "fast_interval_s": 2.0,
    "lease_duration_s": 8.0,
    "failure_fraction": 0.6,
    "recovery_fraction": 0.4,
    "confirm_period_s": 4.0,
    "recovery_period_s": 10.0,
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


def test_every_mutant_still_finds_its_code_once() -> None:
    """A mutant whose code moved or changed would report itself stale when run, minutes in:
    said here instead, the moment the code moves."""
    stale = [
        f"{name}: {path}"
        for name, (path, old, _, _) in MUTANTS.items()
        if not (ROOT / path).exists() or (ROOT / path).read_text().count(old) != 1
    ]
    assert not stale, "mutants that no longer find their code once:\n" + "\n".join(stale)
