"""Every Deployment of a seed, watched from a thread: when each one's replicas changed, and a
status that follows its spec (the test control plane runs no deployment controller; at hundreds
of namespaces one watch, where ``standins.DeploymentController`` polls one namespace).

The times are the watch's arrival times (``time.monotonic()``), a few milliseconds after the
write: good enough to time a scale-down against a cut to well under the ±1 s that matters.
The status is copied by other threads from a queue (eight, as kube-controller-manager runs
five deployment workers and a ReplicaSet's), so a burst of 750 scale writes is observed as it
happens and followed within a fraction of a second, not one after the other.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from core.errors import Gone, KubeError
from testenv.base.kapi import Client
from testenv.kube.standins import follow_spec, status_follows

DEPLOYMENTS = "/apis/apps/v1/deployments"
COPIERS = 8


@dataclass(frozen=True)
class Seen:
    at: float
    namespace: str
    name: str
    replicas: int
    recorded: bool  # carries the aggregator's record


class DeploymentWatch:
    def __init__(self, connect: Callable[[], Client], record: str) -> None:
        """``connect()`` makes a fresh client (one per thread); ``record``: the annotation of
        the aggregator's record (given: the harness imports no program)."""
        self._connect = connect
        self._record = record
        self.history: list[Seen] = []
        self.now: dict[tuple[str, str], Seen] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._copies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._watch, name="seed-deployments", daemon=True),
            *(
                threading.Thread(target=self._copy, name=f"seed-deployment-status-{i}", daemon=True)
                for i in range(COPIERS)
            ),
        ]

    def __enter__(self) -> DeploymentWatch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        for _ in range(COPIERS):
            self._copies.put({})
        for t in self._threads:
            t.join(15)

    def _note(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        recorded = self._record in (meta.get("annotations") or {})
        s = Seen(
            time.monotonic(), meta["namespace"], meta["name"], int(obj["spec"].get("replicas", 1)), recorded
        )
        with self._lock:
            before = self.now.get((s.namespace, s.name))
            self.now[(s.namespace, s.name)] = s
            if before is None or (before.replicas, before.recorded) != (s.replicas, s.recorded):
                self.history.append(s)
        if not status_follows(obj):
            self._copies.put(obj)

    def _watch(self) -> None:
        with self._connect() as c:
            while not self._halt.is_set():
                try:
                    listed = c.get(DEPLOYMENTS)
                    for obj in listed.get("items") or []:
                        self._note(obj)
                    rv = listed["metadata"]["resourceVersion"]
                    while not self._halt.is_set():
                        for event in c.watch(DEPLOYMENTS, timeout_s=30, resourceVersion=rv):
                            obj = event["object"]
                            rv = obj["metadata"]["resourceVersion"]
                            if event["type"] in ("ADDED", "MODIFIED"):
                                self._note(obj)
                except Gone:
                    continue  # list again
                except (KubeError, OSError, httpx.HTTPError):
                    self._halt.wait(0.5)

    def _copy(self) -> None:
        with self._connect() as c:
            while not self._halt.is_set():
                obj = self._copies.get()
                if not obj:
                    return
                with contextlib.suppress(KubeError, OSError, httpx.HTTPError):
                    follow_spec(c, obj)

    def changes(self, since: float, until: float = float("inf")) -> list[Seen]:
        with self._lock:
            return [s for s in self.history if since <= s.at < until]

    def first(self, namespace: str, name: str, since: float, replicas: int, recorded: bool) -> float | None:
        """When the deployment first showed ``replicas`` (and a record or not) since ``since``."""
        with self._lock:
            for s in self.history:
                if (
                    s.at >= since
                    and (s.namespace, s.name) == (namespace, name)
                    and (s.replicas, s.recorded) == (replicas, recorded)
                ):
                    return s.at
        return None
