"""What the scaler tells: a log line once per episode and dependent rather than once per tick,
and Kubernetes Events on the dependents, sent beside the writes rather than before the next.

An Event is a report, not part of the action: one that fails never fails a scale, and in
dry-run none is sent (an Event is a write too)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

from aggregator.kube.client import KubeApi
from aggregator.model.dependents import Dependent
from aggregator.observe.replicas import DependentState
from core.errors import KubeError

COMPONENT = "dwd-lease-aggregator"
# Said at warning level when told once; every other fact told once is info.
WARNINGS = frozenset({"timeout", "invalid", "absent"})


class Events:
    def __init__(self, client: KubeApi, namespace: str, *, log: Any, dry_run: bool) -> None:
        self.client = client
        self.namespace = namespace
        self.log = log
        self.dry_run = dry_run
        self._told: set[tuple[str, str]] = set()
        # Events in flight: a report is never on the way of the next write.
        self._sending: set[asyncio.Task[None]] = set()

    def new_episode(self) -> None:
        """A new direction: every fact may be told again."""
        self._told.clear()

    def first(self, name: str, what: str) -> bool:
        """Whether ``what`` about ``name`` is told for the first time this episode (and from now
        on, it has been)."""
        if (name, what) in self._told:
            return False
        self._told.add((name, what))
        return True

    def once(self, name: str, what: str, event: str, **kw: Any) -> None:
        """Log a fact once per episode and dependent, not once per tick."""
        if self.first(name, what):
            level = "warning" if what in WARNINGS else "info"
            getattr(self.log, level)(event, **({"resource": name} | kw))

    def send(self, d: Dependent, s: DependentState, reason: str, message: str, kind: str) -> None:
        """An Event on ``d``, sent beside the actuator's next steps: in a seed-wide outage 750 of
        them waited in line before the next level's writes."""
        self._later(self._event(d, s, reason, message, kind))

    def _later(self, report: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(report)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def close(self) -> None:
        """Drop the Events still in flight: the target is stopping."""
        sending = list(self._sending)
        for task in sending:
            task.cancel()
        await asyncio.gather(*sending, return_exceptions=True)

    async def _event(self, d: Dependent, s: DependentState, reason: str, message: str, kind: str) -> None:
        if self.dry_run:
            return  # an Event is a write too
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
            await self.client.create(f"/api/v1/namespaces/{self.namespace}/events", event)
        except KubeError as e:
            # An Event is a report, not part of the action: never fail a scale for it.
            self.log.warning("event_failed", reason=reason, error=str(e))
