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


class Hold:
    """What one replica knows of one election Lease, and what it may do with it.

    Its term ends a renew deadline after it sent its last successful renewal; it may take a
    Lease held by another only once that holder's renewTime has stood still for a lease
    duration by this replica's own clock. The first ends before the second can begin, so two
    holders never act at once (client-go's rule, for every Lease it is used on).
    """

    def __init__(self, identity: str, timings: Leader, clock: Callable[[], float]) -> None:
        self.identity = identity
        self.timings = timings
        self.clock = clock
        self.renewed_at = float("-inf")  # our clock, when our last successful renewal was sent
        self.observed: tuple[str, str] = ("", "")  # (holder, renewTime) last seen
        self.observed_at = float("-inf")
        self.holder = ""

    def holds(self) -> bool:
        return self.clock() - self.renewed_at < self.timings.renew_deadline_s

    def term_end(self) -> float:
        """Until when (by ``clock``) this replica may write."""
        return self.renewed_at + self.timings.renew_deadline_s

    def observe(self, record: LeaderRecord) -> None:
        self.holder = record.holder
        if (record.holder, record.renew_time) != self.observed:
            self.observed, self.observed_at = (record.holder, record.renew_time), self.clock()

    def mine(self) -> bool:
        return self.holder == self.identity

    def free(self) -> bool:
        """Nobody holds it, or its holder has not renewed it for a lease duration."""
        expired = self.clock() - self.observed_at >= self.timings.lease_duration_s
        return not self.holder or (expired and not self.mine())

    def spec(self, record: LeaderRecord | None, now_wall: str) -> dict[str, Any]:
        """The spec that renews (ours) or takes (anyone else's) the Lease ``record`` describes."""
        mine = record is not None and record.holder == self.identity
        transitions = 0 if record is None else record.transitions + (0 if mine else 1)
        acquire = (record.acquire_time or now_wall) if record is not None and mine else now_wall
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.timings.lease_duration_s),
            "acquireTime": acquire,
            "renewTime": now_wall,
            "leaseTransitions": transitions,
        }

    def renewed(self, sent_at: float, now_wall: str) -> None:
        self.renewed_at, self.holder = sent_at, self.identity
        self.observed, self.observed_at = (self.identity, now_wall), self.clock()

    def given_up(self) -> None:
        self.renewed_at = float("-inf")


class LeaderElector:
    """One election Lease, read and renewed every retry period."""

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
        self.retry_period_s = settings.retry_period_s
        self.identity = identity or new_identity()
        self.clock = clock
        self.hold = Hold(self.identity, settings, clock)

    @property
    def holder(self) -> str:
        return self.hold.holder

    def is_leader(self) -> bool:
        return self.hold.holds()

    def term_end(self) -> float:
        """Until when (by ``clock``) this replica may write: its last renewal plus the renew
        deadline, which ends before any standby may take over (client-go's rule)."""
        return self.hold.term_end()

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

    async def _try_once(self) -> None:
        now_wall = format_micro_time(datetime.now(UTC))
        sent_at = self.clock()
        try:
            lease = await self.seed.get(self.path)
        except NotFound:
            try:
                body = {"metadata": {"name": self.name}, "spec": self.hold.spec(None, now_wall)}
                await self.seed.create(self.collection, body)
                self.hold.renewed(sent_at, now_wall)
            except Conflict:
                pass
            return
        record = LeaderRecord.from_object(lease)
        self.hold.observe(record)
        if not (self.hold.mine() or self.hold.free()):
            return
        lease["spec"] = self.hold.spec(record, now_wall)
        try:
            # A PUT on the resourceVersion we read: of two candidates only one wins.
            await self.seed.request("PUT", self.path, body=lease)
        except Conflict:
            return
        self.hold.renewed(sent_at, now_wall)

    async def release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby need not wait a lease duration."""
        if not self.is_leader():
            return
        self.hold.given_up()
        try:
            lease = await self.seed.get(self.path)
            if LeaderRecord.from_object(lease).holder == self.identity:
                lease["spec"]["holderIdentity"] = ""
                await self.seed.request("PUT", self.path, body=lease)
        except KubeError as e:
            log.warning("leader_release_failed", error=str(e))


def new_identity() -> str:
    """This replica's name in every election: its host (the pod's name) and a random part, so a
    restarted pod of the same name is not taken for its predecessor."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
