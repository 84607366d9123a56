"""Converging the dependent controllers towards what the phase wants, level by level.

Level-triggered: every tick reads each dependent of the current level and makes
at most the writes that bring it closer to the desired state; any error is
simply tried again on the next tick. A level starts only when the level it
depends on has converged (dependency-watchdog's order: down MCM and CA, then
KCM; up KCM, then MCM, then CA), so a seed that fails one write never runs the
controllers out of order.

What is ours is what carries our record (aggregator/model/records.py); the seed has other
writers (dependency-watchdog, gardenlet, operators), and their marks are left alone:
- down: a running dependent gets our record (the replicas it runs at that moment,
  with dependency-watchdog's keys beside it) and its 0 in one write: there is no
  moment with a zero and no record, and one write less per dependent where 250
  targets write at once. One already at 0 without a record is not running: nothing
  is taken away, nothing recorded;
- held down: someone else raising it (dependency-watchdog's scale-up, an operator)
  is reported, the record takes the new count, and it is lowered again;
- up: only from 0 (dependency-watchdog's rule: any other count is somebody's
  choice), to the recorded count; the record goes only once this leader has read
  the scale back done (ready, or its timeout spent);
- an ignored dependent (``ignore-scaling``) is never written, and its record kept;
- every write is conditional and within the leader's term (aggregator/act/writes.py); in
  dry-run nothing is written at all.
Reading is aggregator/observe/replicas.py's, writing writes.py's, telling telling.py's: this
module is the policy. Its state within a direction is one ``Episode``, replaced when the
direction changes; what a write did is one ``Written``.
The annotations alone are the state: a restarted aggregator, or a new leader,
continues from them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aggregator.act.events import Events
from aggregator.act.telling import Telling
from aggregator.act.writes import Write, Writer
from aggregator.kube.client import KubeApi
from aggregator.lead.scope import Scope
from aggregator.model.dependents import Dependent, Direction, levels
from aggregator.model.records import CLEARED, Record, record_marks
from aggregator.model.settings import ScaleSettings
from aggregator.model.verdict import Desired
from aggregator.observe.replicas import DependentState, Replicas
from aggregator.ops.metrics import AggregatorMetrics
from core import logs
from core.errors import KubeError

log = logs.get("scaler")


@dataclass
class Episode:
    """One direction's run, from when the phase wanted it: when each level converged (the next
    one's initial delays count from then), since when each dependent has been at its target
    (its timeout counts from then), and the dependents seen held at 0 (one running again was
    raised by someone else)."""

    since: float
    level_done_at: dict[int, float] = field(default_factory=dict)
    at_target_since: dict[str, float] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Written:
    """What ``Scaler._write`` did: the object as written (None where the scale subresource
    answered with a Scale: read it), or nothing at all in dry-run."""

    obj: Mapping[str, Any] | None = None
    dry_run: bool = False


class Scaler:
    def __init__(
        self,
        seed: KubeApi,
        namespace: str,
        dependents: Sequence[Dependent],
        *,
        settings: ScaleSettings | None = None,
        label: str = "",
        clock: Callable[[], float] = time.monotonic,
        scope: Scope,
        metrics: AggregatorMetrics | None = None,
        watched: Callable[[Dependent], DependentState | None] | None = None,
        events: KubeApi | None = None,
    ) -> None:
        self.namespace = namespace
        self.dependents = tuple(dependents)
        self.settings = settings or ScaleSettings()
        self.dry_run = self.settings.dry_run
        self.target = label or namespace
        self.clock = clock
        self.metrics = metrics or AggregatorMetrics()
        self.log = log.bind(target=self.target)
        # Reading, writing and telling, each in a module of its own: this class is the policy.
        self.replicas = Replicas(seed, namespace, target=self.target, metrics=self.metrics, watched=watched)
        self.writer = Writer(seed, namespace, self.replicas, scope, clock)
        self.events = Events(events or seed, namespace, log=self.log, dry_run=self.dry_run)
        self.tell = Telling(self.events, self.metrics, self.log, target=self.target, namespace=namespace)
        self.errors: dict[str, str] = {}
        self.desired: Desired | None = None
        self.converged = False
        self.episode = Episode(0.0)
        self._verified_at = -math.inf
        # Written to their target, waiting for their controller to follow (``_track_arrival``).
        self._following: set[str] = set()

    def forget(self) -> None:
        """Read everything again before trusting that it converged."""
        self.desired, self.converged = None, False

    async def records(self) -> bool:
        """Whether any dependent carries our record of a scale-down: the state a start continues
        from. Read from the seed, not from the watch: a new leader's watch may not have delivered
        the previous leader's last write yet, and 'nothing recorded' would then be taken for the
        truth."""
        for d in self.dependents:
            await self.replicas.get(d)
        return any(s.record is not None for s in self.replicas.state.values())

    async def converge(self, desired: Desired, reason: str) -> bool:
        """One step towards ``desired``; True once every dependent is there."""
        now = self.clock()
        if desired is not self.desired:
            # A new direction: its levels, their waits and what was told start again.
            self.desired, self.converged, self.episode = desired, False, Episode(now)
            self.events.new_episode()
            self.replicas.new_episode()
        if desired is Desired.HOLD:
            return True  # a start found records of ours: nothing moves until a fresh verdict
        if self.converged and self._still_converged(desired, now):
            return True
        direction = Direction.DOWN if desired is Desired.SCALED_DOWN else Direction.UP
        base = self.episode.since
        for i, level in enumerate(levels(self.dependents, direction)):
            if not await self._converge_level(level, direction, base, reason):
                self.converged = False
                return False
            base = self.episode.level_done_at.setdefault(i, self.clock())
        missing = [
            d
            for d in self.dependents
            if not d.optional and d.name in self.replicas.state and not self.replicas.state[d.name].exists
        ]
        self.converged, self._verified_at = not missing, now
        return self.converged

    async def hand_back(self, reason: str) -> bool:
        """Remove our marks from every dependent and leave its replicas as they are: its owner
        (gardenlet hibernating, deleting or migrating the shoot) decides them now, and Gardener
        does not scale up what carries ``meltdown-protection-active``. True once none is left."""
        done = True
        for d in self.dependents:
            try:
                state = await self.replicas.get(d)
                if state.newer_format:
                    self.tell.newer(d, state)
                if state.exists and state.record is not None and (state.written or state.label is not None):
                    await self._write(d, Write(CLEARED), state, reason, towards="hand-back")
                    self.events.send(d, state, "HandedBack", f"{reason}", "Normal")
            except KubeError as e:
                self.errors[d.name] = str(e)
                done = False
        return done and not self.dry_run  # a dry-run removed nothing: nothing is handed back

    def _still_converged(self, desired: Desired, now: float) -> bool:
        """Whether a converged actuator may skip this tick. Running, it looks at the watch (no
        I/O) for a record of ours: a write of a previous holder that landed after the hand-over,
        a watch that had not delivered it when this one started. Without a watch, and while
        scaled down (someone may raise a dependent), it reads the seed again every
        ``reverify_s``."""
        if desired is Desired.RUNNING and self.replicas.watched is not None:
            seen = [self.replicas.from_watch(d) for d in self.dependents]
            if all(s is not None for s in seen):
                return not any(s is not None and s.record is not None for s in seen)
        return now - self._verified_at < self.settings.reverify_s

    async def _converge_level(
        self, level: Sequence[Dependent], direction: Direction, base: float, reason: str
    ) -> bool:
        """One level's steps; on the way down, while its only wait is for controllers to follow
        a write, read again a few times at a short interval before giving the tick back (down
        races KCM's grace period; up has initial delays of its own, and a tick held waiting
        would delay the verdict on a relapse)."""
        pending = list(level)
        polls = self.settings.follow_polls if direction is Direction.DOWN else 0
        for poll in range(polls + 1):
            if poll and any(self.replicas.from_watch(d) is None for d in pending):
                return False  # a poll would be a GET each: only the watch is asked this often
            if poll:
                await asyncio.sleep(self.settings.follow_poll_s)
            self._following -= {d.name for d in pending}
            done = await asyncio.gather(*(self._one(d, direction, base, reason) for d in pending))
            pending = [d for d, ok in zip(pending, done, strict=True) if not ok]
            if not pending:
                return True
            if any(d.name not in self._following for d in pending):
                return False  # an error, an initial delay, a timeout to wait: the next tick's
        return False

    async def _one(self, d: Dependent, direction: Direction, base: float, reason: str) -> bool:
        """One dependent's steps this tick; True once it is where ``direction`` wants it (in
        dry-run: once a write would take it there). A failure is tried again next tick."""
        try:
            return await self._steps(d, direction, base, reason)
        except KubeError as e:
            self.metrics.scale_actions.inc(
                target=self.target, resource=d.name, direction=direction, result="failed"
            )
            if self.errors.get(d.name) != str(e):
                self.log.warning("scale_step_failed", resource=d.name, direction=str(direction), error=str(e))
            self.errors[d.name] = str(e)
            return False

    async def _steps(self, d: Dependent, direction: Direction, base: float, reason: str) -> bool:
        """Up to ``steps_per_tick`` writes towards ``direction``, each from the state the one
        before left; then whether the dependent has arrived (``_finish``)."""
        step = d.step(direction)
        state = await self.replicas.read(d)
        if state.newer_format:
            self.tell.newer(d, state)
        for _ in range(self.settings.steps_per_tick):
            if not state.exists:
                if (message := self.tell.absent(d, state)) is not None:
                    self.errors[d.name] = message
                return True
            if (
                direction is Direction.DOWN
                and d.name in self.episode.held
                and state.replicas
                and not state.ignored
            ):
                self.episode.held.discard(d.name)
                self.tell.raised(d, state, reason)
            if direction is Direction.UP and restores_without_count(state):
                self.events.once(d.name, "invalid", "record_invalid", restoring=state.restore_to())
            write = next_write(state, direction, self.clock() >= base + step.initial_delay_s, self.target)
            if write is None:
                return await self._finish(d, state, direction, step.timeout_s, reason)
            # Moved away from the target (by us, or by someone else raising it): the
            # controller has to follow again, its timeout counts from the next arrival.
            self.episode.at_target_since.pop(d.name, None)
            written = await self._write(d, write, state, reason, towards=str(direction))
            if written.dry_run:
                return True  # as if done, so the status shows what every level would do
            # A write on the object answers with it: no read needed to know where it is. A
            # scale subresource answers with a Scale: the object is read from the seed.
            state = (
                self.replicas.keep(d, written.obj) if written.obj is not None else await self.replicas.get(d)
            )
        return False

    async def _finish(
        self, d: Dependent, state: DependentState, direction: Direction, timeout_s: float, reason: str
    ) -> bool:
        """Nothing left to write: whether the dependent has arrived (``_track_arrival``); once it
        has, our record cleared on the way up, and the arrival told."""
        done = self._track_arrival(d, state, direction, timeout_s)
        if done and state.record is not None and not state.ignored:
            if direction is Direction.UP:
                cleared = await self._write(d, Write(CLEARED), state, reason, towards=str(direction))
                if cleared.obj is not None:
                    self.replicas.keep(d, cleared.obj)
            self.tell.arrived(d, state, reason, down=self.desired is Desired.SCALED_DOWN)
        self.errors.pop(d.name, None)
        return done

    def _track_arrival(self, d: Dependent, s: DependentState, direction: Direction, timeout_s: float) -> bool:
        """Follow a dependent at the wanted spec until it has settled, its controller followed
        (or its timeout spent): True once it has. On the way it is noted held down (``held``),
        since when it is at the target, and still followed (``_following``); a spent timeout is
        told once."""
        if s.ignored or (s.record is None and (direction is Direction.UP or s.replicas == 0)):
            return True  # left alone: ignored, not ours, or not running
        countless = s.restore_to() is None  # a later release's record: held, or handed back
        if direction is Direction.DOWN and (s.replicas != 0 or not (s.marks_complete() or countless)):
            return False  # waiting for its initial delay
        if direction is Direction.UP and s.replicas == 0:
            return countless
        if direction is Direction.DOWN:
            self.episode.held.add(d.name)
        followed = s.current == 0 if direction is Direction.DOWN else s.ready >= s.replicas
        since = self.episode.at_target_since.setdefault(d.name, self.clock())
        if followed:
            return True
        if self.clock() - since >= timeout_s:
            self.events.once(d.name, "timeout", "scale_not_observed", timeout_s=timeout_s)
            return True
        self._following.add(d.name)
        return False

    async def _write(
        self, d: Dependent, write: Write, state: DependentState, reason: str, *, towards: str
    ) -> Written:
        """One write (aggregator/act/writes.py). In dry-run none, the one place that decides so:
        what it would have written is told once and counted (``towards``: the direction, or a
        hand-back)."""
        if self.dry_run:
            self.events.once(d.name, "dry-run", "dry_run_write", direction=towards, **write.fields())
            self.metrics.dry_run_writes.inc(target=self.target, resource=d.name, direction=towards)
            return Written(dry_run=True)
        written = await self.writer.write(d, write, state)
        if write.replicas is not None:
            self.tell.scaled(d, state, write.replicas, reason)
        return Written(written)

    async def close(self) -> None:
        """Drop the Events still in flight: the target is stopping."""
        await self.events.close()

    def report(self, reason: str, message: str, kind: str = "Warning") -> None:
        """An Event about the target as a whole, on its first dependent (what an operator of the
        control plane looks at), sent in the background like every other; nothing in dry-run,
        which writes nothing."""
        if not self.dependents:
            return
        d = self.dependents[0]
        state = self.replicas.state.get(d.name, DependentState(d.name, exists=False))
        self.events.send(d, state, reason, message, kind)

    def snapshot(self) -> dict[str, Any]:
        return {
            name: {**s.to_status(), "error": self.errors.get(name, "")}
            for name, s in sorted(self.replicas.state.items())
        }


def next_write(s: DependentState, direction: Direction, may_start: bool, target: str) -> Write | None:
    """The next write towards ``direction`` (``target``: ours, named in a new record); None when
    nothing is to be written now (done, not ours, or waiting for the initial delay: the
    scaler's ``_track_arrival`` tells which)."""
    if s.ignored:
        return None
    if direction is Direction.DOWN:
        # A running dependent's record and its zero go in one write: never a zero without it.
        zero = 0 if s.replicas > 0 else None
        if s.record is None:
            if s.replicas == 0:
                return None  # not running: nothing to take away, and nothing of ours
            return Write(record_marks(Record.now(s.replicas, target)), zero) if may_start else None
        if s.replicas > 0 and s.replicas != s.record.replicas:
            # Raised by someone else while held down: what they set is what comes back.
            return Write(record_marks(replace(s.record, replicas=s.replicas)), zero)
        if (restore := s.restore_to()) is None:
            return None  # a later release's record without a count: held as it was found
        if not s.marks_complete():
            # dependency-watchdog's scale-up removes its protection mark: gardenlet needs it.
            # A later release's record rewritten is this release's: that release reads it.
            return Write(record_marks(replace(s.record, replicas=restore)), zero)
        return Write(replicas=0) if s.replicas != 0 else None
    if s.record is None or s.replicas != 0:
        # Not ours, or running: up only from 0, any other count is somebody's choice.
        return None
    if (restore := s.restore_to()) is None:
        return None  # nothing this release can restore: handed back (``_track_arrival``)
    return Write(replicas=restore) if may_start else None


def restores_without_count(s: DependentState) -> bool:
    """A record of ours at 0 whose count was lost, restored from dependency-watchdog's beside it."""
    return (
        not s.ignored
        and s.record is not None
        and s.replicas == 0
        and s.restore_to() is not None
        and s.record.replicas is None
        and not s.newer_format
    )
