"""Leader election on a coordination.k8s.io Lease in the seed, with client-go's rules.

The leader renews every retry period; it stops acting as soon as it has not
renewed for the renew deadline, which is shorter than the lease duration, so
its writes end before a standby may take over. A standby takes over when it
has not seen the lease's renewTime change for a lease duration (by its own
clock). Optimistic concurrency (resourceVersion) decides every race.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aggregator.kube import KubeClient
from aggregator.objects import section
from aggregator.settings import Leader
from core import logs
from core.errors import Conflict, KubeError, NotFound
from core.lease import format_micro_time, lease_path, leases_path

log = logs.get("leader")


@dataclass(frozen=True)
class LeaderRecord:
    """The election record in the seed Lease's spec."""

    holder: str
    renew_time: str
    acquire_time: str
    transitions: int

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> LeaderRecord:
        spec = section(obj, "spec")
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            acquire_time=str(spec.get("acquireTime") or ""),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


class LeaderElector:
    def __init__(
        self,
        seed: KubeClient,
        settings: Leader,
        name: str = "dwd-lease-aggregator",
        *,
        identity: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # ``settings`` has checked lease duration > renew deadline > retry period.
        self.seed = seed
        self.path = lease_path(settings.namespace, name)
        self.collection = leases_path(settings.namespace)
        self.name = name
        self.lease_duration_s = settings.lease_duration_s
        self.renew_deadline_s = settings.renew_deadline_s
        self.retry_period_s = settings.retry_period_s
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.clock = clock
        self._renewed_at = float("-inf")  # our clock, our last successful renewal
        self._observed: tuple[str, str] = ("", "")  # (holder, renewTime) last seen
        self._observed_at = float("-inf")
        self.holder = ""

    def is_leader(self) -> bool:
        return self.clock() - self._renewed_at < self.renew_deadline_s

    def term_end(self) -> float:
        """Until when (by ``clock``) this replica may write: its last renewal plus the renew
        deadline, which ends before any standby may take over (client-go's rule)."""
        return self._renewed_at + self.renew_deadline_s

    async def run(self) -> None:
        was_leader = False
        while True:
            try:
                await self._try_once()
            except KubeError as e:
                log.warning("leader_election_failed", error=str(e), identity=self.identity)
            leader = self.is_leader()
            if leader != was_leader:
                log.info("leader_changed", leader=leader, identity=self.identity, holder=self.holder)
                was_leader = leader
            await asyncio.sleep(self.retry_period_s)

    def _spec(self, now_wall: str, transitions: int, acquire: str) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.lease_duration_s),
            "acquireTime": acquire,
            "renewTime": now_wall,
            "leaseTransitions": transitions,
        }

    async def _try_once(self) -> None:
        now_wall = format_micro_time(datetime.now(UTC))
        try:
            lease = await self.seed.get(self.path)
        except NotFound:
            try:
                await self.seed.create(
                    self.collection,
                    {"metadata": {"name": self.name}, "spec": self._spec(now_wall, 0, now_wall)},
                )
                self._renewed_at, self.holder = self.clock(), self.identity
            except Conflict:
                pass
            return
        record = LeaderRecord.from_object(lease)
        self.holder = record.holder
        if (record.holder, record.renew_time) != self._observed:
            self._observed, self._observed_at = (record.holder, record.renew_time), self.clock()
        mine = record.holder == self.identity
        expired = self.clock() - self._observed_at >= self.lease_duration_s
        if not (mine or not record.holder or expired):
            return
        transitions = record.transitions + (0 if mine else 1)
        acquire = (record.acquire_time or now_wall) if mine else now_wall
        lease["spec"] = self._spec(now_wall, transitions, acquire)
        try:
            # A PUT on the resourceVersion we read: of two candidates only one wins.
            await self.seed.request("PUT", self.path, body=lease)
        except Conflict:
            return
        self._renewed_at, self.holder = self.clock(), self.identity
        self._observed, self._observed_at = (self.identity, now_wall), self.clock()

    async def release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby need not wait a lease duration."""
        if not self.is_leader():
            return
        self._renewed_at = float("-inf")
        try:
            lease = await self.seed.get(self.path)
            if LeaderRecord.from_object(lease).holder == self.identity:
                lease["spec"]["holderIdentity"] = ""
                await self.seed.request("PUT", self.path, body=lease)
        except KubeError as e:
            log.warning("leader_release_failed", error=str(e))
