"""When the extension controller takes an Extension up without gardenlet asking: an operation of
ours that failed (a deletion too), after a backoff that doubles, or one under way (the shoot part
being taken away), on the next pass. gardenlet asking anew (a new generation or ``gardener.cloud/timestamp``)
is answered at once; a failure is not retried sooner for an annotation that stays on (a
``restore`` is removed only once it has succeeded).

Pure: the reconciler hands in its clock's time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aggregator.extension.contract import ExtensionView, wants_reconcile
from aggregator.model.backoff import Backoff


@dataclass(frozen=True)
class Again:
    """An operation to take up again at ``due``, after ``attempts`` failures in a row, while
    gardenlet has ``asked`` nothing new (ExtensionView.asked)."""

    due: float
    attempts: int
    asked: tuple[int, str]


@dataclass
class Retries:
    backoff: Backoff
    again: dict[str, Again] = field(default_factory=dict)

    def asked(self, view: ExtensionView, now: float, *, first_look: bool) -> bool:
        """Whether to reconcile now: gardenlet asks (``wants_reconcile``), or ours is due again."""
        again = self.again.get(view.namespace)
        if again is not None and again.asked == view.asked:
            return now >= again.due
        return wants_reconcile(view, first_look=first_look)

    def due(self, view: ExtensionView, now: float) -> bool:
        """Whether an operation that goes on unasked (a deletion) is to be tried now: at once,
        unless the last try of it failed and its backoff has not run out. The delete request
        raises the generation once, so a reconcile's backoff never delays the deletion."""
        again = self.again.get(view.namespace)
        return again is None or again.asked != view.asked or now >= again.due

    def under_way(self, view: ExtensionView, now: float) -> None:
        self.again[view.namespace] = Again(now, 0, view.asked)

    def finished(self, view: ExtensionView, now: float, *, failed: bool) -> None:
        if not failed:
            self.again.pop(view.namespace, None)
            return
        before = self.again.get(view.namespace)
        attempts = (before.attempts if before is not None else 0) + 1
        self.again[view.namespace] = Again(now + self.backoff.delay(attempts), attempts, view.asked)
