"""Lease lifecycle: one lease per node, created when the node appears, deleted when it goes.

The aggregator owns the lease object and its duration and interval; the agent only renews.
The leases are owned by the agent's DaemonSet beside them: an uninstall (a ManagedResource
deleted, the DaemonSet with it) takes every lease with it, whether or not an aggregator runs.
Where there is no such DaemonSet, the node owns its lease, as before. The node's uid is kept
in an annotation either way: a node re-created under the same name gets its lease rewritten.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aggregator.act.budget import Pacing
from aggregator.kube.client import KubeApi
from aggregator.model.settings import ProvisionSettings
from aggregator.observe.watcher import Observed
from core import logs
from core.durations import format_duration
from core.errors import Conflict, Forbidden, KubeError, NotFound, NotLeading
from core.lease import (
    AGENT_DAEMONSET,
    MAX_NODE_NAME,
    NODE_UID,
    RENEW_INTERVAL,
    lease_metadata,
    lease_name,
    leases_path,
    node_lease_path,
)

log = logs.get("provisioner")


@dataclass(frozen=True)
class Wanted:
    """What the aggregator writes into a node's lease."""

    duration_s: int
    interval: str


class Provisioner:
    def __init__(
        self,
        shoot: KubeApi,
        observed: Observed,
        settings: ProvisionSettings,
        *,
        lease_duration_s: float,
        label: str = "",
        clock: Callable[[], float] = time.monotonic,
        deadline: Callable[[], float] = lambda: math.inf,
    ) -> None:
        self.shoot = shoot
        self.observed = observed
        self.namespace = settings.lease_namespace
        self.lease_duration_s = lease_duration_s
        self.min_gap_s = 1.0 / settings.writes_per_s
        self.clock = clock
        # Until when (by ``clock``) this replica may write: a pass of 100 s at 5000 nodes
        # must not go on writing the shoot after the leader's term ended.
        self.deadline = deadline
        self.log = log.bind(target=label)
        self.taken: set[str] = set()
        # The agent's DaemonSet as an owner reference (None: none in the lease namespace).
        self.daemonset: dict[str, Any] | None = None

    def desired(self, node: str, pacing: Pacing) -> Wanted:
        # A slow node's lease says how long it may be quiet: four of its intervals.
        fast = node in pacing.fast
        duration = self.lease_duration_s if fast else 4 * pacing.slow_interval_s
        return Wanted(max(1, round(duration)), format_duration(pacing.interval_s(node)))

    def plan(self, pacing: Pacing) -> tuple[list[str], list[str], list[str]]:
        """(create, update, delete) lease names that bring the leases in line with the nodes."""
        nodes, leases = self.observed.nodes, self.observed.own

        def order(names: Iterable[str]) -> list[str]:
            # The sample first: the verdict waits for its members, the slow rest does not.
            return sorted(names, key=lambda n: (n not in pacing.fast, n))

        # A node whose name leaves no room for the prefix gets no lease: it is never judged by
        # one (docs/design.md), and its agent refuses to start and says why.
        create = order(n for n in nodes if n not in leases and len(n) <= MAX_NODE_NAME)
        delete = sorted(n for n in leases if n not in nodes)
        update = []
        for name in order(set(nodes) & set(leases)):
            have, want = leases[name].view, self.desired(name, pacing)
            node_uid = nodes[name].view.uid
            owner_uid = self.daemonset["uid"] if self.daemonset else node_uid
            if (
                have.duration_s != want.duration_s
                or have.interval != want.interval
                or owner_uid not in have.owner_uids
                or node_uid not in (have.node_uid, *have.owner_uids)
            ):
                update.append(name)
        return create, update, delete

    async def _find_daemonset(self) -> None:
        """The agent's DaemonSet, read once a pass (a 403 from older RBAC, a 404: none)."""
        path = f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{AGENT_DAEMONSET}"
        try:
            ds = await self.shoot.get(path)
        except (NotFound, Forbidden):
            self.daemonset = None
            return
        except KubeError as e:
            self.log.info("daemonset_unread", error=str(e))  # the last answer stands
            return
        meta = ds.get("metadata") or {}
        uid = meta.get("uid")
        self.daemonset = (
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": AGENT_DAEMONSET, "uid": str(uid)}
            if uid and not meta.get("deletionTimestamp")
            else None
        )

    async def reconcile(self, pacing: Callable[[], Pacing]) -> None:
        """One pass; writes are paced so a 5000-node start does not burst on KAPI, and end with
        the leader's term (the next leader's pass takes over). A pass lasts 100 s at 5000 nodes:
        each write asks ``pacing`` for the plan in force (re-planned only when it is due)."""
        await self._find_daemonset()
        create, update, delete = self.plan(pacing())
        writes = [
            *(functools.partial(self._create, n, pacing) for n in create),
            *(functools.partial(self._update, n, pacing) for n in update),
            *(functools.partial(self._delete, n) for n in delete),
        ]
        try:
            for write in writes:
                await self._write(write)
        except NotLeading as e:
            self.log.info("provisioning_stopped", why=str(e), planned=len(writes))

    async def _write(self, write: Callable[[], Awaitable[None]]) -> None:
        remaining = self.deadline() - self.clock()
        if remaining <= 0:
            raise NotLeading("the leader's term ended")
        try:
            async with asyncio.timeout(remaining):
                await write()
        except TimeoutError as e:
            raise NotLeading("the leader's term ended during a lease write") from e
        except KubeError as e:
            self.log.warning("lease_write_failed", error=str(e))
        await asyncio.sleep(self.min_gap_s)

    def _owner(self, name: str) -> dict[str, Any]:
        owner = self.daemonset or {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": self.observed.nodes[name].view.uid,
        }
        return {**owner, "blockOwnerDeletion": False, "controller": False}

    async def _create(self, name: str, pacing: Callable[[], Pacing]) -> None:
        want = self.desired(name, pacing())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                **lease_metadata(name),
                "annotations": {RENEW_INTERVAL: want.interval, NODE_UID: self.observed.nodes[name].view.uid},
                "ownerReferences": [self._owner(name)],
            },
            "spec": {"leaseDurationSeconds": want.duration_s},
        }
        try:
            await self.shoot.create(leases_path(self.namespace), body)
            self.log.info("lease_created", node=name)
        except Conflict:
            # Created meanwhile (by an earlier pass or a previous leader); or the name is taken
            # by a lease that is not ours (no label: the watch never shows it, and the admission
            # policy keeps us from writing it). Said once per node.
            if name not in self.taken:
                self.taken.add(name)
                self.log.warning("lease_name_taken_or_raced", node=name, lease=lease_name(name))

    async def _update(self, name: str, pacing: Callable[[], Pacing]) -> None:
        want = self.desired(name, pacing())
        await self.shoot.merge_patch(
            node_lease_path(self.namespace, name),
            {
                "metadata": {
                    "annotations": {
                        RENEW_INTERVAL: want.interval,
                        NODE_UID: self.observed.nodes[name].view.uid,
                    },
                    "ownerReferences": [self._owner(name)],
                },
                "spec": {"leaseDurationSeconds": want.duration_s},
            },
        )

    async def _delete(self, name: str) -> None:
        try:
            await self.shoot.delete(node_lease_path(self.namespace, name))
            self.log.info("lease_deleted", node=name)
        except NotFound:
            pass
