"""What the scaler tells of what it finds and does: each fact as a log line, an Event on the
dependent and a metric, a fact that stays true told once an episode (events.py's ``first``).
The policy is aggregator/act/scaler.py's; sending the Events is events.py's."""

from __future__ import annotations

from typing import Any

from aggregator.act.events import Events
from aggregator.model.dependents import Dependent, Direction
from aggregator.model.records import FORMAT
from aggregator.observe.replicas import DependentState
from aggregator.ops.metrics import AggregatorMetrics


class Telling:
    def __init__(
        self, events: Events, metrics: AggregatorMetrics, log: Any, *, target: str, namespace: str
    ) -> None:
        self.events = events
        self.metrics = metrics
        self.log = log
        self.target = target
        self.namespace = namespace

    def raised(self, d: Dependent, s: DependentState, reason: str) -> None:
        """A dependent we held at 0 runs again: someone else raised it. Counted each time, told
        once an episode; the record follows and it is lowered again."""
        self.metrics.overridden.inc(target=self.target, resource=d.name)
        if not self.events.first(d.name, "raised"):
            return
        message = (
            f"{d.name} was raised to {s.replicas} by someone else while protection is active: "
            f"lowering it again, {s.replicas} will be restored ({reason})"
        )
        self.log.warning("dependent_raised_by_someone_else", resource=d.name, replicas=s.replicas)
        self.events.send(d, s, "RaisedWhileProtected", message, "Warning")

    def newer(self, d: Dependent, s: DependentState) -> None:
        """A record a later release wrote (a rollback while it held the shoot down): read as far
        as this release knows it and acted on as ours; told once an episode, as an Event and on
        the status page."""
        if not self.events.first(d.name, "newer"):
            return
        restore = s.restore_to()
        then = f"{restore} to restore" if restore is not None else "no count to restore: handed back"
        message = (
            f"{d.name} carries a dwd-lease record of format {s.newer_format}, newer than this release "
            f"writes ({FORMAT}): read as far as this release knows it, {then}"
        )
        self.log.warning("record_from_a_newer_release", resource=d.name, format=s.newer_format)
        self.events.send(d, s, "RecordFromNewerRelease", message, "Warning")

    def absent(self, d: Dependent, s: DependentState) -> str | None:
        """A dependent that does not exist: nothing runs, so the levels after it may go on. One
        that is not optional is an error (a typo in the dependents file switches protection off):
        its message, told once an episode."""
        if d.optional:
            self.events.once(d.name, "absent", "scale_skipped", why="absent")
            return None
        message = f"{d.kind} {self.namespace}/{d.name} does not exist and is not optional"
        self.metrics.missing.set(1, target=self.target, resource=d.name)
        if self.events.first(d.name, "missing"):
            self.log.error("dependent_missing", resource=d.name)
            self.events.send(d, s, "DependentMissing", message, "Warning")
        return message

    def scaled(self, d: Dependent, state: DependentState, replicas: int, reason: str) -> None:
        down = replicas == 0
        direction = Direction.DOWN if down else Direction.UP
        self.metrics.scale_actions.inc(
            target=self.target, resource=d.name, direction=direction, result="scaled"
        )
        self.log.info("resource_scaling", resource=d.name, replicas_from=state.replicas, replicas_to=replicas)
        self.events.send(
            d,
            state,
            "ScaledDown" if down else "ScaledUp",
            f"Scaled {d.name} from {state.replicas} to {replicas} replicas: {reason}",
            "Warning" if down else "Normal",
        )

    def arrived(self, d: Dependent, s: DependentState, reason: str, *, down: bool) -> None:
        """A dependent where the episode wanted it: down, up, or (a later release's record with no
        count this release reads, nor dependency-watchdog's beside it) handed back: our marks
        removed, the replicas left to its owner (gardenlet raises what no longer carries the
        protection mark)."""
        if down:
            replicas = None if s.record is None else s.record.replicas
            self.events.once(d.name, "done", "resource_scaled_down", replicas_before=replicas, reason=reason)
        elif s.replicas != 0:
            self.events.once(d.name, "done", "resource_scaled_up", replicas=s.replicas, reason=reason)
        elif self.events.first(d.name, "done"):
            message = (
                f"{d.name} carried a dwd-lease record of format {s.newer_format} with no count this "
                f"release reads, nor a dependency-watchdog replicas: our marks removed, its replicas "
                f"left to its owner ({reason})"
            )
            self.log.warning("resource_handed_back", resource=d.name, format=s.newer_format, reason=reason)
            self.events.send(d, s, "HandedBack", message, "Warning")
