"""A dependent's replicas and the marks on it (ours and dependency-watchdog's), as read from
the seed-wide watch or the seed: what the scaler decides its next write from."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from aggregator.kube.client import KubeApi
from aggregator.model.dependents import Dependent
from aggregator.model.objects import metadata, resource_version, section
from aggregator.model.records import (
    IGNORE_SCALING,
    MELTDOWN,
    RECORD,
    REPLICAS,
    Record,
    from_label,
    label_value,
)
from aggregator.ops.metrics import AggregatorMetrics
from core import logs
from core.errors import NotFound

# Superseded versions kept per dependent: more than the writes of one episode.
SUPERSEDED_KEPT = 16

log = logs.get("scaler")


@dataclass(frozen=True)
class DependentState:
    """One dependent as last read from the seed."""

    name: str
    exists: bool
    replicas: int = 0  # spec
    current: int = 0  # status.replicas
    ready: int = 0  # status.readyReplicas
    record: Record | None = None  # ours
    dwd_replicas: str | None = None  # dependency-watchdog's ``replicas``, whoever wrote it
    protected: bool = False  # ``meltdown-protection-active``, whoever wrote it
    ignored: bool = False
    resource_version: str = ""
    # Our record is in the object as our annotation; False for a record this process remembers
    # and the object lost (``Replicas._remembered``). ``label``: our label's value (the sweep lists by
    # it; it carries the count too), None without one.
    written: bool = True
    label: str | None = None

    @classmethod
    def from_object(cls, name: str, obj: Mapping[str, Any]) -> DependentState:
        meta, spec, status = metadata(obj), section(obj, "spec"), section(obj, "status")
        ann = section(meta, "annotations")
        replicas = spec.get("replicas")
        record = ann.get(RECORD)
        label = section(meta, "labels").get(RECORD)
        parsed = Record.parse(str(record)) if record is not None else None
        return cls(
            name=name,
            exists=True,
            replicas=1 if replicas is None else int(replicas),
            current=int(status.get("replicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
            # Our label alone is our mark too (another writer removed the annotation): ours, its
            # count from the label, else from dependency-watchdog's key beside it (``restore_to``).
            record=parsed if parsed is not None else (from_label(str(label)) if label is not None else None),
            dwd_replicas=None if ann.get(REPLICAS) is None else str(ann[REPLICAS]),
            protected=MELTDOWN in ann,
            ignored=ann.get(IGNORE_SCALING) == "true",
            resource_version=resource_version(obj),
            written=record is not None,
            label=None if label is None else str(label),
        )

    @property
    def newer_format(self) -> int:
        """The format of a record a later release wrote (0: none such)."""
        return self.record.format if self.record is not None and self.record.newer else 0

    @property
    def foreign(self) -> bool:
        """dependency-watchdog's marks without our record: somebody else's, never acted on."""
        return self.record is None and (self.dwd_replicas is not None or self.protected)

    def restore_to(self) -> int | None:
        """The replicas to bring back: our record's count, unless dependency-watchdog's key
        beside it says otherwise while the dependent is at 0. We write that key with our count,
        so a different one was written after ours by whoever lowered it last, recording what it
        took (dependency-watchdog lowering a count an operator raised it to before we looked):
        what was there last comes back. An unreadable record falls back to that key, then to 1
        (dependency-watchdog's rule); a later release's without a count this release can read
        to None: nothing to restore, it is handed back (aggregator/act/scaler.py)."""
        dwd = _as_int(self.dwd_replicas)
        later = dwd if dwd is not None and dwd > 0 and self.replicas == 0 else None
        if self.record is not None and self.record.replicas is not None:
            return later or self.record.replicas
        if dwd is not None and dwd > 0:
            return dwd
        return None if self.newer_format else 1

    def marks_complete(self) -> bool:
        """Our record with its label, and dependency-watchdog's keys beside it saying the same."""
        return (
            self.record is not None
            and self.written
            and self.label == label_value(self.record)
            and self.protected
            and self.dwd_replicas == str(self.record.replicas)
        )

    def to_status(self) -> dict[str, Any]:
        return {
            "exists": self.exists,
            "replicas": self.replicas,
            "ready": self.ready,
            "record": None
            if self.record is None
            else {"replicas": self.record.replicas, "at": self.record.at, "format": self.record.format},
            "foreign": self.foreign,
            "dwd_replicas": self.dwd_replicas,
            "protected": self.protected,
            "ignored": self.ignored,
            "newer_format": self.newer_format,
        }


def _as_int(text: str | None) -> int | None:
    try:
        return int(text or "")
    except ValueError:
        return None


class Replicas:
    """The dependents of one target as last read: from the seed-wide watch where it can say and
    is trusted, else from the seed. Each read is kept (``state``), with the record this process
    last saw on a dependent whose object lost it."""

    def __init__(
        self,
        seed: KubeApi,
        namespace: str,
        *,
        target: str,
        metrics: AggregatorMetrics,
        watched: Callable[[Dependent], DependentState | None] | None = None,
    ) -> None:
        self.seed = seed
        self.namespace = namespace
        self.target = target
        self.metrics = metrics
        # The dependents as the seed-wide watch has them (aggregator/observe/seeddependents.py); None
        # where it cannot say, and then the seed is asked.
        self.watched = watched
        self.log = log.bind(target=target)
        self.state: dict[str, DependentState] = {}
        # Read from the seed, not the watch, next time: a write conflicted with what it showed.
        self._distrust: set[str] = set()
        # Versions of each dependent known to be older than the state held: every version a
        # write of ours was computed from (answered or refused). A watch that still shows one
        # of them has not caught up; what the write answered, or the seed, is newer.
        self._superseded: dict[str, collections.deque[str]] = {}
        # The record last seen on each dependent that carries one of ours (``_remembered``).
        self._lowered: dict[str, Record] = {}
        self._told_lost: set[str] = set()

    def new_episode(self) -> None:
        """A lost record is told again in the next direction."""
        self._told_lost.clear()

    async def read(self, d: Dependent) -> DependentState:
        """The dependent as the watch has it, or as the seed answers when the watch cannot say."""
        seen = self.from_watch(d)
        if seen is None:
            return await self.get(d)
        held = self.state.get(d.name)
        if held is not None and seen.resource_version in self._superseded.get(d.name, ()):
            return held  # the watch has not caught up with our writes: the held state is newer
        return self._store(seen)

    def from_watch(self, d: Dependent) -> DependentState | None:
        """The watch's view of ``d``; None when it cannot say, or is not trusted for it now."""
        return None if self.watched is None or d.name in self._distrust else self.watched(d)

    def written(self, d: Dependent, state: DependentState, *, refused: bool = False) -> None:
        """A write computed from ``state`` answered (or was refused: then the seed, not the
        watch, is asked next time, since what it was computed from is not the seed's)."""
        if refused:
            self._distrust.add(d.name)
        kept = self._superseded.setdefault(d.name, collections.deque(maxlen=SUPERSEDED_KEPT))
        kept.append(state.resource_version)

    async def get(self, d: Dependent) -> DependentState:
        try:
            obj: Mapping[str, Any] | None = await self.seed.get(d.path(self.namespace))
        except NotFound:
            obj = None
        self._distrust.discard(d.name)
        return self.keep(d, obj)

    def keep(self, d: Dependent, obj: Mapping[str, Any] | None) -> DependentState:
        """The dependent as just read or written (None: it does not exist)."""
        if obj is None:
            return self._store(DependentState(d.name, exists=False))
        return self._store(DependentState.from_object(d.name, obj))

    def _store(self, state: DependentState) -> DependentState:
        state = self._remembered(state)
        if state.exists:
            self.metrics.missing.remove_matching(target=self.target, resource=state.name)
        self.state[state.name] = state
        self.metrics.foreign_records.set(sum(s.foreign for s in self.state.values()), target=self.target)
        return state

    def _remembered(self, state: DependentState) -> DependentState:
        """The dependent with the record this process last saw on it, where the object lost it:
        another writer removed our annotation while it was held at 0 (dependency-watchdog's
        scale-up leaves ours, an operator or a script may not). Lowered by us and still at 0, or
        still carrying our label, it is still ours: the scale-down writes the record back, the
        scale-up restores its count. Running without a mark of ours, nothing of ours is on it."""
        if state.record is not None and state.written:
            self._lowered[state.name] = state.record
            return state
        if state.record is None and (not state.exists or state.replicas != 0):
            self._lowered.pop(state.name, None)
            return state
        if (record := self._lowered.get(state.name)) is None:
            return state  # our label alone (its count from the keys beside it), or nothing of ours
        if state.name not in self._told_lost:
            self._told_lost.add(state.name)
            self.log.warning("record_lost", resource=state.name, remembered=record.replicas)
        return replace(state, record=record, written=False)
