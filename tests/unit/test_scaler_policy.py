"""The scaler's next write (aggregator/act/scaler.py ``next_write``), pure, as a table: the
dependent as read, the direction, whether its initial delay has passed; the write it gets."""

from __future__ import annotations

import pytest

from aggregator.act.scaler import next_write, restores_without_count
from aggregator.model.dependents import Direction
from aggregator.model.records import RECORD, Record, label_value
from aggregator.observe.replicas import DependentState

DOWN, UP = Direction.DOWN, Direction.UP


def ours(replicas: int, *, count: int | None = 3, complete: bool = True) -> DependentState:
    """A dependent at ``replicas`` that carries our record of ``count``, its marks complete (our
    label, dependency-watchdog's keys beside it) or only our annotation."""
    record = Record(count, "shoot")
    return DependentState(
        "kcm",
        exists=True,
        replicas=replicas,
        record=record,
        label=label_value(record) if complete else None,
        protected=complete,
        dwd_replicas=str(count) if complete else None,
    )


@pytest.mark.parametrize(
    ("state", "direction", "may_start", "wanted"),
    [
        # down: a running dependent's record and its zero in one write, after its initial delay
        (DependentState("kcm", exists=True, replicas=3), DOWN, True, ("record 3", 0)),
        (DependentState("kcm", exists=True, replicas=3), DOWN, False, None),
        # not running and not ours: nothing to take away, nothing recorded
        (DependentState("kcm", exists=True, replicas=0), DOWN, True, None),
        # ours, raised by someone else while held: the record takes their count, and it is lowered
        (ours(5), DOWN, False, ("record 5", 0)),
        # ours at 0 with a mark missing (dependency-watchdog's scale-up removed it): written back
        (ours(0, complete=False), DOWN, True, ("record 3", None)),
        (ours(0), DOWN, True, None),
        # ignored: never written
        (DependentState("kcm", exists=True, replicas=3, ignored=True), DOWN, True, None),
        # up: only from 0, to the recorded count, after the initial delay
        (ours(0), UP, True, ("replicas", 3)),
        (ours(0), UP, False, None),
        (ours(2), UP, True, None),  # running: somebody's choice
        (DependentState("kcm", exists=True, replicas=0), UP, True, None),  # not ours
    ],
)
def test_the_next_write(
    state: DependentState, direction: Direction, may_start: bool, wanted: tuple[str, int | None] | None
) -> None:
    write = next_write(state, direction, may_start, "shoot")
    if wanted is None:
        assert write is None
        return
    assert write is not None
    what, replicas = wanted
    assert write.replicas == replicas
    if what.startswith("record"):
        assert write.annotations is not None
        assert Record.parse(str(write.annotations[RECORD])).replicas == int(what.split()[1])


def test_a_record_without_its_count_is_restored_from_dependency_watchdogs_and_said_so() -> None:
    lost = DependentState("kcm", exists=True, replicas=0, record=Record(None, "shoot"), dwd_replicas="2")
    assert restores_without_count(lost)
    write = next_write(lost, UP, True, "shoot")
    assert write is not None and write.replicas == 2
    assert not restores_without_count(ours(0))
