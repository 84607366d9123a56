"""Our record of a scale-down, and the marks of dependency-watchdog beside it.

dependency-watchdog writes ``replicas`` and ``meltdown-protection-active`` on the
dependents it scales down, gardenlet and Gardener's shoot care read them, and
operators use them. So do we, but those keys are shared: dependency-watchdog leaves
``replicas`` on every Deployment it ever restored, so a DWD key alone says nothing
about who lowered a dependent. Ours is a key of our own, ``RECORD``: the replicas
taken away, when, and for which target, plus the label ``RECORD`` so the leader can
list every record across the seed. A dependent with DWD's keys and no record of ours
belongs to someone else: it is never acted on and never cleaned up, only reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from core.lease import PREFIX

# dependency-watchdog's keys: written beside our record, read by gardenlet.
REPLICAS = PREFIX + "replicas"
MELTDOWN = PREFIX + "meltdown-protection-active"
IGNORE_SCALING = PREFIX + "ignore-scaling"

# Ours: an annotation holding the record and a label of the same key to list them by, whose
# value is the count too: a record whose annotations another writer wiped (ours and
# dependency-watchdog's count beside it) still says what to restore. "true" (the label of
# earlier versions) is a record whose count is elsewhere.
RECORD = "dwd-lease.gardener.cloud/scaled-down"
# The record's format, written into it. 1: 0.2.0's (no ``format`` key), read as ever; 2: this
# release's, the same keys and ``format`` (0.2.0 reads it, a rollback keeps what was lowered).
# Formats are additive: a later release keeps these keys and their meaning and only adds its
# own, so a newer record is read as far as the keys this release knows (a rollback restores it).
FORMAT = 2


@dataclass(frozen=True)
class Record:
    """What a scale-down of ours took away: ``replicas`` is None when the record is unreadable."""

    replicas: int | None
    target: str = ""
    at: str = ""
    format: int = FORMAT

    @classmethod
    def parse(cls, text: str) -> Record:
        """Never fails: an unreadable record is still ours (it is our key), its count unknown.
        A later release's is read as far as the keys this release knows; what it added is extra."""
        try:
            raw = json.loads(text)
            fmt = raw.get("format", 1)
            if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
                raise ValueError(fmt)
        except (ValueError, TypeError, AttributeError):
            return cls(None)
        replicas = raw.get("replicas")
        # A count of 0 would restore nothing: a running dependent is never recorded at 0.
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            return cls(None, format=max(fmt, FORMAT))  # unreadable, or a later release's elsewhere
        return cls(replicas, str(raw.get("target") or ""), str(raw.get("at") or ""), fmt)

    @property
    def newer(self) -> bool:
        """Written by a later release, in a format this one does not know."""
        return self.format > FORMAT

    @classmethod
    def now(cls, replicas: int, target: str) -> Record:
        return cls(replicas, target, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def text(self) -> str:
        fields = {"replicas": self.replicas, "target": self.target, "at": self.at, "format": FORMAT}
        return json.dumps(fields, sort_keys=True)


def label_value(record: Record) -> str:
    """Our label's value for ``record``: its count, or "true" when the count is unknown."""
    return str(record.replicas) if record.replicas is not None else "true"


def from_label(value: str) -> Record:
    """The record our label alone holds (its annotation lost): the count, when it has one."""
    count = int(value) if value.isdigit() else 0
    return Record(count if count >= 1 else None)


def record_marks(record: Record) -> dict[str, str | None]:
    """The annotations a scale-down writes: ours, and dependency-watchdog's beside it."""
    return {RECORD: record.text(), REPLICAS: str(record.replicas), MELTDOWN: ""}


# What a finished scale-up removes: every mark a scale-down of ours wrote.
CLEARED: dict[str, str | None] = {RECORD: None, REPLICAS: None, MELTDOWN: None}
