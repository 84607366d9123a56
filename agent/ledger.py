"""The outage ledger: which renewals did not land, as far as the agent knows, and what the lease
is proven to have gone through.

A renewal whose request was sent but never answered may have landed. The renewals after it keep
the renewTime they overwrite (an evidence patch), and the first answer says which landed last:
the ledger settles on it. Only what is proven goes into the ``last-outage`` record
(docs/agent.md): the first renewal that surely failed began the outage, and its failure class
is the cause (later ones are often its echoes, a resolver slowed by the same fault)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from core.lease import Outage
from core.metrics import Counter

# Renewals kept while failing, to learn at recovery which of them landed unseen.
MAX_PENDING = 1000


@dataclass(frozen=True)
class Unrenewed:
    """A renewal that did not land as far as the agent knows."""

    stamp: str  # the renewTime it carried
    wall: datetime  # when it started, as the stamp says
    mono: float  # the same, on the monotonic clock
    failure_class: str
    sent: bool  # it may have landed after all
    path: tuple[dict[str, Any], ...]


class Ledger:
    def __init__(self, log: Any, landed_unseen: Counter) -> None:
        self.log = log
        self.landed_unseen = landed_unseen
        # renewTime of the last renewal known to have landed, and those since that did not.
        self.landed = ""
        self.unrenewed: list[Unrenewed] = []
        # The last step of the path that answered, for the record of what failed.
        self.last_ok: dict[str, Any] = {}

    def failed(self, entry: Unrenewed) -> None:
        # Of a run of renewals that surely failed only the first tells anything.
        if not self.unrenewed or entry.sent or self.unrenewed[-1].sent:
            self.unrenewed.append(entry)
            del self.unrenewed[1 : max(1, len(self.unrenewed) - MAX_PENDING)]

    def unsure(self) -> bool:
        """Whether a renewal may have landed unseen: the next one should carry evidence."""
        return any(u.sent for u in self.unrenewed)

    def settle(self, previous: str) -> None:
        """The renewTime a renewal overwrote is the latest renewal that had landed before it:
        of the unanswered ones before that, none is known lost; after it, all are."""
        stamps = [u.stamp for u in self.unrenewed]
        if previous in stamps:
            i = stamps.index(previous)
            self.landed_unseen.inc()
            self.log.info("renew_unanswered_landed", renew_time=previous, lost_after=len(stamps) - i - 1)
            self.unrenewed = [replace(u, sent=False) for u in self.unrenewed[i + 1 :]]
        elif previous == self.landed:
            self.unrenewed = [replace(u, sent=False) for u in self.unrenewed]  # none landed
        else:
            # Someone else renewed it (another copy of the agent?): nothing about the outage is proven.
            self.log.warning("renew_outage_unproven", renew_time=previous, expected=self.landed)
            self.unrenewed = []

    def outage(self, now: float) -> Outage | None:
        """The outage the lease is proven to have gone through: the renewals after the last one
        that may have landed unseen."""
        sent = [i for i, u in enumerate(self.unrenewed) if u.sent]
        proven = self.unrenewed[sent[-1] + 1 :] if sent else self.unrenewed
        if not proven:
            return None
        first = proven[0]
        path = {"failed": list(first.path), "last_ok": self.last_ok} if first.path or self.last_ok else None
        return Outage(first.wall, now - first.mono, first.failure_class, path)

    def renewed(self, renew_time: str) -> None:
        """A renewal landed: the outage, if any, is over."""
        self.landed = renew_time
        self.unrenewed = []
