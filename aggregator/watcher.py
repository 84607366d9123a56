"""List+watch, and the observed state the decider reads.

An Informer lists a collection, then watches it from the list's
resourceVersion with bookmarks on; a 410 Gone means re-list, any other failure
a jittered back-off and a resumed watch. Freshness means data received from the
server (a LIST, a watch the server accepted, an event or a bookmark), never an
attempt: a watch that keeps failing is not fresh, however often it is retried.

The observed state stamps the local monotonic clock when a lease's renewTime
is seen to change: staleness is measured where it is observed, never from the
node's own clock.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aggregator.decider import LeaseObs, NodeObs
from aggregator.kube import KubeClient
from core import logs
from core.durations import parse_duration
from core.errors import BadResponse, Gone, KubeError, TransportError
from core.lease import IGNORE_NODE, RENEW_INTERVAL, LeaseView

log = logs.get("watcher")

WATCH_GRACE_S = 15.0
# The renew-interval annotation as metadata.managedFields names it.
RENEW_INTERVAL_FIELD = "f:" + RENEW_INTERVAL
# dependency-watchdog's list of conditions that make a node's silence meaningless.
UNHEALTHY_CONDITIONS = ("KernelDeadlock", "ReadonlyFilesystem", "DiskPressure", "NetworkUnavailable")


class Informer:
    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        name: str,
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        accept: str | None = None,
        list_accept: str | None = None,
        watch_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        label: str = "",
    ) -> None:
        self.client = client
        self.path = path
        self.name = name
        self.on_list = on_list
        self.on_event = on_event
        self.accept = accept
        self.list_accept = list_accept or accept
        self.watch_timeout_s = watch_timeout_s
        self.clock = clock
        self.synced = asyncio.Event()
        # Our clock when the server last answered with data; -inf: never.
        self.last_data = float("-inf")
        # The watch is failing now (cleared by the next answer from the server).
        self.failing = False
        self.resource_version = ""
        self.last_error = ""
        self.log = log.bind(target=label, resource=name)
        self.on_restart: Callable[[str], None] = lambda _reason: None

    async def list_now(self) -> list[dict[str, Any]]:
        """A consistent LIST (read from etcd, not the watch cache) fed through on_list."""
        try:
            result = await self.client.request("GET", self.path, accept=self.list_accept)
            items = result.get("items")
            if not isinstance(items, list):
                raise BadResponse(f"LIST {self.path}: no items")
        except KubeError:
            self.failing = True
            raise
        self.resource_version = str((result.get("metadata") or {}).get("resourceVersion") or "")
        self._received()
        self.on_list(items)
        return items

    async def run(self) -> None:
        backoff_s = 0.5
        need_list = True
        while True:
            try:
                if need_list or not self.resource_version:
                    await self.list_now()
                    self.synced.set()
                    need_list = False
                # The server ends every watch after watch_timeout_s; one that runs far
                # longer sits on a dead connection that no read timeout noticed.
                async with asyncio.timeout(self.watch_timeout_s + WATCH_GRACE_S):
                    await self._watch_once()
                backoff_s = 0.5  # a watch that ran to its timeout is healthy: resume at once
                self.last_error = ""
            except Gone:
                self.on_restart("gone")
                self.log.info("watch_expired_relisting", resource_version=self.resource_version)
                need_list = True
            except (KubeError, TimeoutError) as e:
                if isinstance(e, TimeoutError):
                    e = TransportError("timeout", f"WATCH {self.path}: no end after {self.watch_timeout_s}s")
                # Like client-go's reflector: resume the watch from the last
                # resourceVersion (cheap, served from the watch cache); only a
                # 410 or a failed list costs a re-list.
                self.failing = True
                self.on_restart(e.failure_class)
                if str(e) != self.last_error:
                    self.log.warning("watch_failed", error=str(e), retry_in=round(backoff_s, 2))
                self.last_error = str(e)
                await asyncio.sleep(backoff_s * random.uniform(0.8, 1.2))
                backoff_s = min(backoff_s * 2, 5.0)

    async def _watch_once(self) -> None:
        async for event in self.client.watch(
            self.path,
            resource_version=self.resource_version,
            timeout_s=self.watch_timeout_s,
            accept=self.accept,
            on_open=self._received,
        ):
            self._received()
            obj = event.get("object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = str(rv)
            if event.get("type") != "BOOKMARK":
                self.on_event(str(event.get("type")), obj)

    def _received(self) -> None:
        self.last_data = self.clock()
        self.failing = False

    def fresh(self, max_age_s: float) -> bool:
        """The server answered with data within ``max_age_s`` and the watch is not failing now."""
        return not self.failing and self.clock() - self.last_data <= max_age_s


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _interval_s(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return parse_duration(text)
    except ValueError:
        return None


def renewed_after_interval(obj: dict[str, Any]) -> bool:
    """Whether the lease's renewTime was last written after its renew-interval annotation.

    Read from ``metadata.managedFields``: the server stamps, per writer, when that writer
    last changed one of its fields (second resolution). The same second, or an entry that
    is missing, is not "after".
    """
    interval_at = renew_at = None
    for entry in (obj.get("metadata") or {}).get("managedFields") or ():
        fields = entry.get("fieldsV1") or {}
        when = _parse_time(entry.get("time"))
        if when is None:
            continue
        if RENEW_INTERVAL_FIELD in ((fields.get("f:metadata") or {}).get("f:annotations") or {}):
            interval_at = when if interval_at is None else max(interval_at, when)
        if "f:renewTime" in (fields.get("f:spec") or {}):
            renew_at = when if renew_at is None else max(renew_at, when)
    return interval_at is not None and renew_at is not None and renew_at > interval_at


@dataclass
class Observed:
    """Nodes and leases as this aggregator has seen them."""

    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = lambda: datetime.now(UTC)
    nodes: dict[str, NodeObs] = field(default_factory=dict)
    node_uids: dict[str, str] = field(default_factory=dict)
    leases: dict[str, LeaseObs] = field(default_factory=dict)
    lease_objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    # -- nodes
    def _node(self, obj: dict[str, Any]) -> NodeObs | None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return None
        created = _parse_time(meta.get("creationTimestamp"))
        now = self.clock()
        age_s = max(0.0, (self.wall() - created).total_seconds()) if created else 0.0
        conditions = (obj.get("status") or {}).get("conditions") or []
        unhealthy = any(
            c.get("type") in UNHEALTHY_CONDITIONS and c.get("status") == "True" for c in conditions
        )
        return NodeObs(
            name=name,
            created_mono=now - age_s,
            deleting=bool(meta.get("deletionTimestamp")),
            ignored=(meta.get("annotations") or {}).get(IGNORE_NODE) == "true",
            unhealthy=unhealthy,
        )

    def nodes_listed(self, items: list[dict[str, Any]]) -> None:
        fresh = {}
        for obj in items:
            node = self._node(obj)
            if node is not None:
                fresh[node.name] = node
                self.node_uids[node.name] = str((obj.get("metadata") or {}).get("uid", ""))
        for gone in set(self.node_uids) - set(fresh):
            del self.node_uids[gone]
        self.nodes = fresh
        self.changed.set()

    def node_event(self, kind: str, obj: dict[str, Any]) -> None:
        node = self._node(obj)
        if node is None:
            return
        if kind == "DELETED":
            self.nodes.pop(node.name, None)
            self.node_uids.pop(node.name, None)
        else:
            self.nodes[node.name] = node
            self.node_uids[node.name] = str((obj.get("metadata") or {}).get("uid", ""))
        self.changed.set()

    # -- leases
    def _lease(self, obj: dict[str, Any]) -> LeaseObs | None:
        try:
            view = LeaseView.from_object(obj)
        except ValueError:
            return None
        name, renew, interval_s = view.name, view.renew_time, _interval_s(view.renew_interval)
        previous = self.leases.get(name)
        # First sight or a changed renewTime: renewed "now" as far as we can tell.
        # First sight is generous on purpose: a just-started aggregator must not
        # call a lease stale before it has watched it for a whole lease duration.
        now = self.clock()
        seen = now if previous is None or previous.renew_time != renew else previous.seen_renewed_mono
        if previous is None:
            # Only a renewal made after the interval was set proves the agent renews at
            # that pace. At first sight the server's own record of who wrote last says so.
            paced = float("-inf") if renewed_after_interval(obj) else now
        elif previous.interval_s != interval_s:
            paced = now
        else:
            paced = previous.paced_since_mono
        return LeaseObs(
            name=name,
            renew_time=renew,
            seen_renewed_mono=seen,
            released=view.released,
            interval_s=interval_s,
            paced_since_mono=paced,
        )

    def leases_listed(self, items: list[dict[str, Any]]) -> None:
        fresh: dict[str, LeaseObs] = {}
        objects: dict[str, dict[str, Any]] = {}
        for obj in items:
            lease = self._lease(obj)
            if lease is not None:
                fresh[lease.name] = lease
                objects[lease.name] = obj
        self.leases, self.lease_objects = fresh, objects
        self.changed.set()

    def lease_event(self, kind: str, obj: dict[str, Any]) -> None:
        lease = self._lease(obj)
        if lease is None:
            return
        if kind == "DELETED":
            self.leases.pop(lease.name, None)
            self.lease_objects.pop(lease.name, None)
        else:
            self.leases[lease.name] = lease
            self.lease_objects[lease.name] = obj
        self.changed.set()

    def lease_ages(self) -> dict[str, float]:
        now = self.clock()
        return {name: now - lease.seen_renewed_mono for name, lease in self.leases.items()}
