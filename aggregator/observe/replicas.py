"""A dependent's replicas and the marks on it (ours and dependency-watchdog's), as read from
the seed: what the scaler decides its next write from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    # and the object lost (``Scaler._store``). ``label``: our label's value (the sweep lists by
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
        return cls(
            name=name,
            exists=True,
            replicas=1 if replicas is None else int(replicas),
            current=int(status.get("replicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
            # Our label alone is our mark too (another writer removed the annotation): ours, its
            # count from the label, else from dependency-watchdog's key beside it (``restore_to``).
            record=Record.parse(str(record))
            if record is not None
            else (from_label(str(label)) if label is not None else None),
            dwd_replicas=None if ann.get(REPLICAS) is None else str(ann[REPLICAS]),
            protected=MELTDOWN in ann,
            ignored=ann.get(IGNORE_SCALING) == "true",
            resource_version=resource_version(obj),
            written=record is not None,
            label=None if label is None else str(label),
        )

    @property
    def foreign(self) -> bool:
        """dependency-watchdog's marks without our record: somebody else's, never acted on."""
        return self.record is None and (self.dwd_replicas is not None or self.protected)

    def restore_to(self) -> int:
        """The replicas to bring back: our record's count, unless dependency-watchdog's key
        beside it says otherwise while the dependent is at 0. We write that key with our count,
        so a different one was written after ours by whoever lowered it last, recording what it
        took (dependency-watchdog lowering a count an operator raised it to before we looked):
        what was there last comes back. An unreadable record falls back to that key, then to 1
        (dependency-watchdog's rule)."""
        dwd = _as_int(self.dwd_replicas)
        later = dwd if dwd is not None and dwd > 0 and self.replicas == 0 else None
        if self.record is not None and self.record.replicas is not None:
            return later or self.record.replicas
        return dwd if dwd is not None and dwd > 0 else 1

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
            else {"replicas": self.record.replicas, "at": self.record.at},
            "foreign": self.foreign,
            "dwd_replicas": self.dwd_replicas,
            "protected": self.protected,
            "ignored": self.ignored,
        }


def _as_int(text: str | None) -> int | None:
    try:
        return int(text or "")
    except ValueError:
        return None
