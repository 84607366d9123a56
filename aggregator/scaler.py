"""Converging the dependent controllers towards what the phase wants, level by level.

Level-triggered: every tick reads each dependent of the current level and makes
at most the writes that bring it closer to the desired state; any error is
simply tried again on the next tick. A level starts only when the level it
depends on has converged (dependency-watchdog's order: down MCM and CA, then
KCM; up KCM, then MCM, then CA), so a seed that fails one write never runs the
controllers out of order.

Nothing is ever lost:
- down: the replicas are recorded in the ``replicas`` annotation before the
  scale to 0 (a crash in between leaves the record, never a zero without one);
- up: exactly the recorded count is restored, and the record is removed only
  once this leader has read the scale back done (ready, or its timeout spent);
- every write carries the resourceVersion it was computed from, so a write of a
  deposed leader that arrives late fails with a conflict instead of undoing
  what the new leader did, and every write must finish within the leader's
  term (``deadline``).
The annotations alone are the state: a restarted aggregator, or a new leader,
continues from them.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from aggregator.decider import Desired
from aggregator.dependents import Dependent, Direction, levels
from aggregator.kube import KubeClient
from aggregator.objects import metadata, resource_version, section
from aggregator.settings import Scaling
from core import logs
from core.errors import KubeError, NotFound, NotLeading
from core.lease import PREFIX

REPLICAS = PREFIX + "replicas"
MELTDOWN = PREFIX + "meltdown-protection-active"
IGNORE_SCALING = PREFIX + "ignore-scaling"
COMPONENT = "dwd-lease-aggregator"

log = logs.get("scaler")


class ActionResult(StrEnum):
    """How a scale action ended; the value is the metrics' result label."""

    SCALED = "scaled"
    FAILED = "failed"


OnAction = Callable[[str, Direction, ActionResult], None]


@dataclass(frozen=True)
class DependentState:
    """One dependent as last read from the seed."""

    name: str
    exists: bool
    replicas: int = 0  # spec
    current: int = 0  # status.replicas
    ready: int = 0  # status.readyReplicas
    record: str | None = None
    protected: bool = False
    ignored: bool = False
    resource_version: str = ""

    @classmethod
    def from_object(cls, name: str, obj: Mapping[str, Any]) -> DependentState:
        meta, spec, status = metadata(obj), section(obj, "spec"), section(obj, "status")
        ann = section(meta, "annotations")
        replicas = spec.get("replicas")
        return cls(
            name=name,
            exists=True,
            replicas=1 if replicas is None else int(replicas),
            current=int(status.get("replicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
            record=ann.get(REPLICAS),
            protected=MELTDOWN in ann,
            ignored=ann.get(IGNORE_SCALING) == "true",
            resource_version=resource_version(obj),
        )

    @property
    def carries_record(self) -> bool:
        """Our mark of a scale-down, or half of it: either annotation."""
        return self.record is not None or self.protected

    def restore_to(self) -> int:
        """The replicas to restore: the record, or 1 when it is unusable (dependency-watchdog's rule)."""
        try:
            value = int(self.record or "")
        except ValueError:
            return 1
        return value if value >= 0 else 1

    def to_status(self) -> dict[str, Any]:
        return {
            "exists": self.exists,
            "replicas": self.replicas,
            "ready": self.ready,
            "record": self.record,
            "protected": self.protected,
            "ignored": self.ignored,
        }


class Scaler:
    def __init__(
        self,
        seed: KubeClient,
        namespace: str,
        dependents: Sequence[Dependent],
        *,
        settings: Scaling | None = None,
        label: str = "",
        clock: Callable[[], float] = time.monotonic,
        deadline: Callable[[], float] = lambda: math.inf,
        on_action: OnAction = lambda _name, _direction, _result: None,
    ) -> None:
        self.seed = seed
        self.namespace = namespace
        self.dependents = tuple(dependents)
        self.settings = settings or Scaling()
        self.dry_run = self.settings.dry_run
        self.clock = clock
        # Until when (by ``clock``) this replica may write: the end of its leadership term.
        self.deadline = deadline
        # Told (resource, direction, result) of every scale written or failed: for metrics.
        self.on_action = on_action
        self.log = log.bind(target=label or namespace)
        self.state: dict[str, DependentState] = {}
        self.errors: dict[str, str] = {}
        self.desired: Desired | None = None
        self.converged = False
        self._direction_since = 0.0
        self._level_done_at: dict[int, float] = {}
        self._at_target_since: dict[str, float] = {}
        self._verified_at = -math.inf
        self._reported: set[tuple[str, str]] = set()

    def forget(self) -> None:
        """Read everything again before trusting that it converged."""
        self.desired, self.converged = None, False

    @property
    def holds_records(self) -> bool:
        """Whether a dependent carried our record when last read."""
        return any(s.carries_record for s in self.state.values())

    async def records(self) -> bool:
        """Whether any dependent carries our record of a scale-down: the state a start continues from."""
        for d in self.dependents:
            await self._read(d)
        return self.holds_records

    async def converge(self, desired: Desired, reason: str) -> bool:
        """One step towards ``desired``; True once every dependent is there."""
        now = self.clock()
        if desired is not self.desired:
            self.desired, self.converged = desired, False
            self._direction_since, self._level_done_at = now, {}
            self._at_target_since.clear()
            self._reported.clear()
        recently = now - self._verified_at < self.settings.reverify_s
        if self.converged and (desired is Desired.RUNNING or recently):
            return True
        direction = Direction.DOWN if desired is Desired.SCALED_DOWN else Direction.UP
        base = self._direction_since
        for i, level in enumerate(levels(self.dependents, direction)):
            done = await asyncio.gather(*(self._one(d, direction, base, reason) for d in level))
            if not all(done):
                self.converged = False
                return False
            base = self._level_done_at.setdefault(i, now)
        self.converged, self._verified_at = True, now
        return True

    async def _one(self, d: Dependent, direction: Direction, base: float, reason: str) -> bool:
        step = d.step(direction)
        try:
            for _ in range(self.settings.steps_per_tick):
                state = await self._read(d)
                write = self._next_write(d, state, direction, self.clock() >= base + step.initial_delay_s)
                if write is None:
                    done = self._settled(d, state, direction, step.timeout_s)
                    if done and direction is Direction.UP and state.record is not None:
                        await self._write(d, {REPLICAS: None, MELTDOWN: None}, None, state, reason)
                        self._report_done(d, state, reason)
                    elif done and direction is Direction.DOWN and state.exists and not state.ignored:
                        self._report_done(d, state, reason)
                    self.errors.pop(d.name, None)
                    return done
                await self._write(d, *write, state, reason)
            return False
        except KubeError as e:
            self.on_action(d.name, direction, ActionResult.FAILED)
            if self.errors.get(d.name) != str(e):
                self.log.warning("scale_step_failed", resource=d.name, direction=str(direction), error=str(e))
            self.errors[d.name] = str(e)
            return False

    def _next_write(
        self, d: Dependent, s: DependentState, direction: Direction, may_start: bool
    ) -> tuple[dict[str, str | None] | None, int | None] | None:
        """(annotations, replicas) to write next; None when nothing is to be written now
        (done, or waiting for the initial delay: ``_settled`` tells which)."""
        if not s.exists or s.ignored:
            return None
        if direction is Direction.DOWN:
            if self.dry_run:
                self._once(d.name, "dry-run", "dry_run_scale", direction="down", replicas=s.replicas)
                return None
            if s.record is None or not s.protected:
                # The record first: a zero is never written without it.
                return ({REPLICAS: s.record or str(s.replicas), MELTDOWN: ""}, None) if may_start else None
            return (None, 0) if s.replicas != 0 else None
        if s.record is None:
            # Not ours to restore; a protection mark without a record is a leftover.
            return ({MELTDOWN: None}, None) if s.protected else None
        restore = s.restore_to()
        if restore != _as_int(s.record):
            self._once(d.name, "invalid", "replicas_annotation_invalid", value=s.record, restoring=restore)
        if s.replicas < restore:
            return (None, restore) if may_start else None
        return None

    def _settled(self, d: Dependent, s: DependentState, direction: Direction, timeout_s: float) -> bool:
        """At the wanted spec, and the controller has followed (or its timeout is spent)."""
        down = direction is Direction.DOWN
        if not s.exists or s.ignored or (down and self.dry_run):
            if not s.exists:
                self._once(d.name, "absent", "scale_skipped", why="absent")
            return True
        if not down and s.record is None:
            return True
        if down and (s.record is None or not s.protected or s.replicas != 0):
            return False  # waiting for its initial delay
        if not down and s.replicas < s.restore_to():
            return False
        followed = s.current == 0 if down else s.ready >= s.restore_to()
        since = self._at_target_since.setdefault(d.name, self.clock())
        if followed:
            return True
        if self.clock() - since >= timeout_s:
            self._once(d.name, "timeout", "scale_not_observed", timeout_s=timeout_s)
            return True
        return False

    async def _read(self, d: Dependent) -> DependentState:
        try:
            state = DependentState.from_object(d.name, await self.seed.get(d.path(self.namespace)))
        except NotFound:
            state = DependentState(d.name, exists=False)
        self.state[d.name] = state
        return state

    async def _write(
        self,
        d: Dependent,
        annotations: dict[str, str | None] | None,
        replicas: int | None,
        state: DependentState,
        reason: str,
    ) -> None:
        """One write, conditional on the resourceVersion read, within the leader's term."""
        path = d.path(self.namespace)
        precondition = {"resourceVersion": state.resource_version}
        if annotations is not None:
            body: dict[str, Any] = {"metadata": {**precondition, "annotations": annotations}}
        else:
            path += "/scale"
            body = {"metadata": precondition, "spec": {"replicas": replicas}}
        remaining = self.deadline() - self.clock()
        if remaining <= 0:
            raise NotLeading("not the leader: no writes")
        try:
            async with asyncio.timeout(remaining):
                await self.seed.merge_patch(path, body)
        except TimeoutError as e:
            raise NotLeading(f"leadership ended during a write to {d.name}") from e
        if replicas is not None:
            down = replicas == 0
            self.on_action(d.name, Direction.DOWN if down else Direction.UP, ActionResult.SCALED)
            self.log.info(
                "resource_scaling", resource=d.name, replicas_from=state.replicas, replicas_to=replicas
            )
            await self._event(
                d,
                state,
                "ScaledDown" if down else "ScaledUp",
                f"Scaled {d.name} from {state.replicas} to {replicas} replicas: {reason}",
                "Warning" if down else "Normal",
            )

    def _report_done(self, d: Dependent, s: DependentState, reason: str) -> None:
        if self.desired is Desired.SCALED_DOWN:
            self._once(
                d.name,
                "done",
                "resource_scaled_down",
                resource=d.name,
                replicas_before=s.record,
                reason=reason,
            )
        else:
            self._once(
                d.name, "done", "resource_scaled_up", resource=d.name, replicas=s.replicas, reason=reason
            )

    def _once(self, name: str, what: str, event: str, **kw: Any) -> None:
        """Log a fact once per direction and dependent, not once per tick."""
        if (name, what) not in self._reported:
            self._reported.add((name, what))
            level = "warning" if what in ("timeout", "invalid", "absent") else "info"
            getattr(self.log, level)(event, **({"resource": name} | kw))

    async def _event(self, d: Dependent, s: DependentState, reason: str, message: str, kind: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": f"{d.name}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": d.api_version,
                "kind": d.kind,
                "name": d.name,
                "namespace": self.namespace,
                "resourceVersion": s.resource_version,
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.seed.create(f"/api/v1/namespaces/{self.namespace}/events", event)
        except KubeError as e:
            # An Event is a report, not part of the action: never fail a scale for it.
            self.log.warning("event_failed", reason=reason, error=str(e))

    def snapshot(self) -> dict[str, Any]:
        return {
            name: {**s.to_status(), "error": self.errors.get(name, "")}
            for name, s in sorted(self.state.items())
        }


def _as_int(text: str | None) -> int | None:
    try:
        return int(text or "")
    except ValueError:
        return None
