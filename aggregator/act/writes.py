"""The one way a dependent is written: a merge patch conditional on the resourceVersion it was
computed from, within the leader's term.

A write of a deposed leader that arrives late fails with a conflict instead of undoing what
the new leader did, and a write that cannot finish within the term is abandoned as not
leading. Our record, its label and dependency-watchdog's keys beside it go in one write with
the zero that needs them (aggregator/model/records.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.kube.client import KubeApi
from aggregator.lead.scope import Scope
from aggregator.model.dependents import Dependent
from aggregator.model.records import RECORD, Record, label_value
from aggregator.observe.replicas import DependentState, Replicas
from core.errors import Conflict, NotFound, NotLeading


@dataclass(frozen=True)
class Write:
    """One write to a dependent: its annotations and our label (and its replicas with them, on
    the object itself), or its scale alone (on the scale subresource)."""

    annotations: Mapping[str, str | None] | None = None
    replicas: int | None = None

    def fields(self) -> dict[str, Any]:
        """What a dry-run log line says it would have written."""
        if self.replicas is not None:
            return {"replicas": self.replicas}
        return {"annotations": dict(self.annotations or {})}


class Writer:
    def __init__(
        self, seed: KubeApi, namespace: str, replicas: Replicas, scope: Scope, clock: Callable[[], float]
    ) -> None:
        self.seed = seed
        self.namespace = namespace
        self.replicas = replicas
        # Until when this replica may write, and its writes in flight (aggregator/lead/scope.py).
        self.scope = scope
        self.clock = clock

    async def write(self, d: Dependent, write: Write, state: DependentState) -> Mapping[str, Any] | None:
        """``write``, conditional on ``state``'s resourceVersion, within the leader's term.
        Returns the object as written when the write was on the object itself (a scale
        subresource answers with a Scale)."""
        path, body = patch(d.path(self.namespace), write, state.resource_version)
        remaining = self.scope.term_end() - self.clock()
        if remaining <= 0:
            raise NotLeading("not the leader: no writes")
        try:
            with self.scope.writes.write(d.path(self.namespace)):
                try:
                    async with asyncio.timeout(remaining):
                        written = await self.seed.merge_patch(path, body)
                except TimeoutError as e:
                    raise NotLeading(f"leadership ended during a write to {d.name}") from e
        except (Conflict, NotFound):
            self.replicas.written(d, state, refused=True)
            raise
        self.replicas.written(d, state)
        return written if write.annotations is not None else None


def patch(path: str, write: Write, resource_version: str) -> tuple[str, dict[str, Any]]:
    """The merge patch of ``write``, conditional on ``resource_version``: on the object when it
    carries annotations (the record), else on its scale subresource."""
    precondition = {"resourceVersion": resource_version}
    if write.annotations is None:
        return path + "/scale", {"metadata": precondition, "spec": {"replicas": write.replicas}}
    ours = write.annotations.get(RECORD)
    body: dict[str, Any] = {
        "metadata": {
            **precondition,
            "annotations": dict(write.annotations),
            # The label lists our records across the seed (the leader's sweep for orphans).
            "labels": {RECORD: None if ours is None else label_value(Record.parse(ours))},
        }
    }
    if write.replicas is not None:
        body["spec"] = {"replicas": write.replicas}
    return path, body
