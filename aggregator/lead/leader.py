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

from aggregator.kube.client import KubeApi
from aggregator.lead.scope import Scope, Writes
from aggregator.model.objects import metadata, section
from aggregator.model.settings import LeaderSettings
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


# On every election Lease of ours: which aggregator's (its base name), and what it is (leader,
# shard, member): the shard Leases and the leader Lease see each other (aggregator/lead/shards.py).
GROUP = "dwd-lease.gardener.cloud/aggregator"
ROLE = "dwd-lease.gardener.cloud/role"

# What a Hold has seen of a Lease that is not there (and, at first, of one not yet read).
ABSENT = ("", "")


class Hold:
    """What one replica knows of one election Lease, and what it may do with it.

    Its term ends a renew deadline after it sent its last successful renewal; it may take a
    Lease held by another only once that holder's renewTime has stood still for a lease
    duration by this replica's own clock. The first ends before the second can begin, so two
    holders never act at once (client-go's rule, for every Lease it is used on).
    """

    def __init__(self, identity: str, timings: LeaderSettings, clock: Callable[[], float]) -> None:
        self.identity = identity
        self.timings = timings
        self.clock = clock
        self.renewed_at = float("-inf")  # our clock, when our last successful renewal was sent
        self.observed: tuple[str, str] = ABSENT  # (holder, renewTime) last seen
        self.observed_at = float("-inf")
        self.holder = ""
        # What this replica wrote under the Lease that may still land (aggregator/lead/scope.py).
        self.writes = Writes()

    def scope(self) -> Scope:
        return Scope(self.holds, self.term_end, self.writes)

    def holds(self) -> bool:
        return self.clock() - self.renewed_at < self.timings.renew_deadline_s

    def term_end(self) -> float:
        """Until when (by ``clock``) this replica may write."""
        return self.renewed_at + self.timings.renew_deadline_s

    def observe(self, record: LeaderRecord) -> None:
        if record.holder != self.identity and self.holds():
            # Taken while we held it (someone edited it by hand): stop acting at once.
            self.given_up()
        self.holder = record.holder
        if (record.holder, record.renew_time) != self.observed:
            self.observed, self.observed_at = (record.holder, record.renew_time), self.clock()

    def vanish(self) -> None:
        """The Lease is not there. One that was (deleted by someone) is free a lease duration
        after it went, as if its holder had stopped renewing: that holder may still be acting
        until its term ends. One never seen is free at once."""
        if self.holds():
            self.given_up()
        self.holder = ""
        if self.observed != ABSENT:
            self.observed, self.observed_at = ABSENT, self.clock()

    def mine(self) -> bool:
        return self.holder == self.identity

    def free(self) -> bool:
        """Given back, gone for a lease duration, or its holder has not renewed it for one."""
        expired = self.clock() - self.observed_at >= self.timings.lease_duration_s
        if self.observed == ABSENT:
            return expired
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


def role(obj: Mapping[str, Any]) -> str:
    """What an election Lease of ours is: leader, shard or member."""
    return str((metadata(obj).get("labels") or {}).get(ROLE) or "")


async def list_ours(seed: KubeApi, collection: str, base: str) -> dict[str, Mapping[str, Any]]:
    """The election Leases of aggregator ``base`` in a namespace, by name: one LIST by label."""
    listed = await seed.get(collection, labelSelector=f"{GROUP}={base}")
    return {str(metadata(o).get("name") or ""): o for o in listed.get("items") or () if isinstance(o, dict)}


class Others:
    """Leases another replica may hold, each a Hold kept from one LIST to the next (a holder is
    only known to have stopped once its renewTime has stood still for a lease duration)."""

    def __init__(self, identity: str, timings: LeaderSettings, clock: Callable[[], float]) -> None:
        self.identity, self.timings, self.clock = identity, timings, clock
        self.holds: dict[str, Hold] = {}

    def held(self, leases: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Of ``leases`` (all of the kind watched, as just listed), the names someone holds now."""
        for name in set(self.holds) - set(leases):
            del self.holds[name]
        for name, obj in leases.items():
            hold = self.holds.setdefault(name, Hold(self.identity, self.timings, self.clock))
            hold.observe(LeaderRecord.from_object(obj))
        return sorted(n for n, h in self.holds.items() if h.holder and not h.mine() and not h.free())


class LeaderElector:
    """One election Lease, read and renewed every retry period."""

    def __init__(
        self,
        seed: KubeApi,
        settings: LeaderSettings,
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
        self._scope = self.hold.scope()
        self._settle_s = settings.renew_deadline_s
        self._labels = {GROUP: name, ROLE: "leader"}
        self._shards = Others(self.identity, settings, clock)  # seen while about to take the Lease

    @property
    def holder(self) -> str:
        return self.hold.holder

    def is_leader(self) -> bool:
        return self.hold.holds()

    def term_end(self) -> float:
        """Until when (by ``clock``) this replica may write: its last renewal plus the renew
        deadline, which ends before any standby may take over (client-go's rule)."""
        return self.hold.term_end()

    def leading(self) -> bool:
        return self.is_leader()

    def scope(self, namespace: str) -> Scope:
        """Every target acts in the one Lease's scope."""
        del namespace
        return self._scope

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
            self.hold.vanish()
            if not self.hold.free() or await self._shards_held():
                return
            try:
                body = {
                    "metadata": {"name": self.name, "labels": self._labels},
                    "spec": self.hold.spec(None, now_wall),
                }
                await self.seed.create(self.collection, body)
                self.hold.renewed(sent_at, now_wall)
            except Conflict:
                pass
            return
        record = LeaderRecord.from_object(lease)
        self.hold.observe(record)
        if not (self.hold.mine() or self.hold.free()):
            return
        if not self.hold.mine() and await self._shards_held():
            return
        lease["spec"] = self.hold.spec(record, now_wall)
        lease.setdefault("metadata", {})["labels"] = {
            **(lease["metadata"].get("labels") or {}),
            **self._labels,
        }
        try:
            # A PUT on the resourceVersion we read: of two candidates only one wins.
            await self.seed.request("PUT", self.path, body=lease)
        except Conflict:
            return
        self.hold.renewed(sent_at, now_wall)

    async def _shards_held(self) -> bool:
        """Whether replicas sharded (``DWD_SHARDS`` > 1) hold shards of the same targets: a
        rollout that turns sharding off waits for their Leases to expire before it leads.
        Asked only when about to take the Lease, so a standby sends nothing more."""
        leases = await list_ours(self.seed, self.collection, self.name)
        held = self._shards.held({n: o for n, o in leases.items() if role(o) == "shard"})
        if held:
            log.warning("leader_election_blocked", by=held, why="shards held under DWD_SHARDS > 1")
        return bool(held)

    async def release(self) -> None:
        """On a clean shutdown: stop acting, wait for the writes in flight (each ends by the term's
        end), then give the Lease up so a standby need not wait a lease duration; unless a write
        of this term may still land: then the Lease is left to expire, so that no standby takes
        over while it can (aggregator/lead/scope.py)."""
        if not self.is_leader():
            return
        self.hold.given_up()
        if not await self.hold.writes.settled(self._settle_s):
            log.warning("leader_lease_left_to_expire", why="a write may still land", identity=self.identity)
            return
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
