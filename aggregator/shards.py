"""The targets shared out over the aggregator's replicas: a fixed number of shard Leases.

One process acts on every target of a seed in turn, and in a seed-wide outage the last
target waits for the others' interlocks and writes (docs/scale.md). With ``DWD_SHARDS`` of
two or more:

- a target belongs to the shard its name hashes to (``shard_of``): the same in every
  replica and across restarts, whatever the replicas are;
- each shard is a Lease held as the leader's Lease is (aggregator/leader.py ``Hold``): its
  holder's term ends a renew deadline after its last renewal, before anyone may take it;
- each replica renews a member Lease of its own; the live members are those whose
  renewTime is seen to move. A replica takes free shards (no holder, or a holder that has
  not renewed for a lease duration) while it holds fewer than its share, ceil(shards /
  live members), and gives one back per retry period once it has held more than its share
  for a lease duration, the shards it prefers least first (each replica prefers its own
  order of the shards, so two rarely reach for the same one);
- it takes nothing during its first lease duration: by then it has seen every live member
  (otherwise the first replica to start would take every shard, as knative's buckets did in
  tektoncd/pipeline#3835), and its targets could not judge before then anyway;
- one LIST of the namespace's Leases by label, per retry period, shows every member and
  every shard; each Lease is written by a PUT on the version listed, so of two replicas
  reaching for the same shard one conflicts.

Every replica watches and judges every target, so a shard that moves is acted on by a
replica whose view is warm. The holder of a target's shard alone provisions its shoot,
checks the interlocks, writes and reports; shard 0's holder also sweeps the records of
removed targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aggregator.kube import KubeClient
from aggregator.leader import Hold, LeaderRecord, new_identity
from aggregator.objects import metadata, resource_version
from aggregator.settings import Leader
from core import logs
from core.errors import Conflict, KubeError, NotFound
from core.lease import format_micro_time, lease_path, leases_path

log = logs.get("shards")

# On every Lease of the sharding: which aggregator's (its base name), and what it is.
GROUP = "dwd-lease.gardener.cloud/aggregator"
ROLE = "dwd-lease.gardener.cloud/role"
# A member Lease that has not moved for this many lease durations is a replica that died
# without saying so (SIGKILL, a lost node): it is deleted, or such Leases would pile up.
STALE_MEMBER_DURATIONS = 10


def shard_of(name: str, count: int) -> int:
    """The shard a target belongs to: a stable hash of its name (Python's ``hash`` is salted per
    process, and every replica must agree)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % count


def _preference(identity: str, shard: int) -> bytes:
    # Rendezvous order: each replica its own ranking of the shards.
    return hashlib.sha256(f"{identity}/{shard}".encode()).digest()


def _label_safe(identity: str) -> str:
    """An identity as part of a Lease's name (a DNS subdomain: lower case, digits, '-', '.')."""
    return re.sub(r"[^a-z0-9.-]+", "-", identity.lower()).strip("-.")[:200] or "replica"


@dataclass
class Member:
    """Another replica's member Lease as seen from here: since when its renewTime stands."""

    renew_time: str
    first_at: float
    changed_at: float
    version: str

    def live(self, now: float, lease_duration_s: float) -> bool:
        # Seen once proves nothing (a replica that died long ago leaves its Lease behind).
        return self.changed_at > self.first_at and now - self.changed_at < lease_duration_s


class Shards:
    def __init__(
        self,
        seed: KubeClient,
        settings: Leader,
        count: int,
        *,
        name: str = "dwd-lease-aggregator",
        identity: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seed = seed
        self.settings = settings
        self.count = count
        self.base = name
        self.identity = identity or new_identity()
        self.clock = clock
        self.collection = leases_path(settings.namespace)
        self.names = [f"{name}-shard-{i}" for i in range(count)]
        self.holds = [Hold(self.identity, settings, clock) for _ in range(count)]
        self.member_name = f"{name}-member-{_label_safe(self.identity)}"
        self.members: dict[str, Member] = {}
        self.started_at = clock()
        self._excess_since: float | None = None
        self._held_before: tuple[int, ...] = ()

    # -- what the targets ask

    def leads(self, target: str) -> bool:
        return self.holds[shard_of(target, self.count)].holds()

    def term_end(self, target: str) -> float:
        return self.holds[shard_of(target, self.count)].term_end()

    def sweeps(self) -> bool:
        return self.holds[0].holds()

    def sweep_term_end(self) -> float:
        return self.holds[0].term_end()

    def held(self) -> list[int]:
        return [i for i, h in enumerate(self.holds) if h.holds()]

    def live_members(self) -> int:
        now = self.clock()
        return 1 + sum(m.live(now, self.settings.lease_duration_s) for m in self.members.values())

    def share(self) -> int:
        return math.ceil(self.count / self.live_members())

    def snapshot(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "held": self.held(),
            "members": self.live_members(),
            "share": self.share(),
        }

    # -- the loop

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except KubeError as e:
                log.warning("shards_failed", error=str(e), identity=self.identity)
            held = tuple(self.held())
            if held != self._held_before:
                log.info(
                    "shards_changed", held=list(held), members=self.live_members(), identity=self.identity
                )
                self._held_before = held
            await asyncio.sleep(self.settings.retry_period_s)

    async def step(self) -> None:
        """One retry period: list, renew what is ours, take or give back towards the share."""
        now_wall = format_micro_time(datetime.now(UTC))
        sent_at = self.clock()
        listed = await self.seed.get(self.collection, labelSelector=f"{GROUP}={self.base}")
        leases = {metadata(o).get("name", ""): o for o in listed.get("items") or () if isinstance(o, dict)}
        self._see_members(leases)
        for name, hold in zip(self.names, self.holds, strict=True):
            if name in leases:
                hold.observe(LeaderRecord.from_object(leases[name]))
            else:
                hold.holder = ""
        writes = [self._renew_member(leases.get(self.member_name), now_wall)]
        mine = [i for i, h in enumerate(self.holds) if h.mine()]
        give_back = self._give_back(mine)
        for i in mine:
            if i == give_back:
                writes.append(self._release(i, leases[self.names[i]]))
            else:
                writes.append(self._write(i, leases[self.names[i]], now_wall, sent_at))
        for i in self._to_take(len(mine)):
            writes.append(self._write(i, leases.get(self.names[i]), now_wall, sent_at))
        for result in await asyncio.gather(*writes, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(result, KubeError):
                raise result
            if isinstance(result, KubeError):
                log.warning("shard_write_failed", error=str(result))

    def _see_members(self, leases: Mapping[str, Mapping[str, Any]]) -> None:
        now = self.clock()
        seen = set()
        for name, obj in leases.items():
            if metadata(obj).get("labels", {}).get(ROLE) != "member" or name == self.member_name:
                continue
            seen.add(name)
            renew = str(LeaderRecord.from_object(obj).renew_time)
            member = self.members.get(name)
            if member is None:
                self.members[name] = Member(renew, now, now, resource_version(obj))
            elif member.renew_time != renew:
                member.renew_time, member.changed_at = renew, now
            if member is not None:
                member.version = resource_version(obj)
        for gone in set(self.members) - seen:
            del self.members[gone]

    def _to_take(self, holding: int) -> list[int]:
        """The free shards to reach for now, most preferred first, up to the share."""
        if self.clock() - self.started_at < self.settings.lease_duration_s:
            return []  # the first lease duration: every live member is seen before anything is taken
        free = [i for i, h in enumerate(self.holds) if h.free()]
        free.sort(key=lambda i: _preference(self.identity, i))
        return free[: max(0, self.share() - holding)]

    def _give_back(self, mine: list[int]) -> int | None:
        """The one shard to give back this period, if more than the share has been held for a
        lease duration (a member just seen need not stay, and a shard that moves costs its
        targets a retry period without a writer)."""
        now = self.clock()
        if len(mine) <= self.share():
            self._excess_since = None
            return None
        if self._excess_since is None:
            self._excess_since = now
        if now - self._excess_since < self.settings.lease_duration_s:
            return None
        return max(mine, key=lambda i: _preference(self.identity, i))

    def _body(self, i: int, lease: Mapping[str, Any] | None, spec: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.names[i], "labels": {GROUP: self.base, ROLE: "shard"}}
        if lease is not None:
            meta["resourceVersion"] = resource_version(lease)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def _write(self, i: int, lease: Mapping[str, Any] | None, now_wall: str, sent_at: float) -> None:
        """Renew or take shard ``i``: a PUT on the version listed, or its creation."""
        hold = self.holds[i]
        record = None if lease is None else LeaderRecord.from_object(lease)
        body = self._body(i, lease, hold.spec(record, now_wall))
        try:
            if lease is None:
                await self.seed.create(self.collection, body)
            else:
                await self.seed.request("PUT", lease_path(self.settings.namespace, self.names[i]), body=body)
        except (Conflict, NotFound):
            return  # another replica wrote it first: it is theirs, or free again next period
        hold.renewed(sent_at, now_wall)

    async def _release(self, i: int, lease: Mapping[str, Any]) -> None:
        self.holds[i].given_up()  # no more acting on it from this moment, written or not
        spec = {**dict(lease.get("spec") or {}), "holderIdentity": ""}
        with contextlib.suppress(Conflict, NotFound):
            await self.seed.request(
                "PUT", lease_path(self.settings.namespace, self.names[i]), body=self._body(i, lease, spec)
            )
        log.info("shard_given_back", shard=i, share=self.share(), identity=self.identity)

    async def _renew_member(self, lease: Mapping[str, Any] | None, now_wall: str) -> None:
        meta: dict[str, Any] = {"name": self.member_name, "labels": {GROUP: self.base, ROLE: "member"}}
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.settings.lease_duration_s),
            "renewTime": now_wall,
        }
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
        if lease is None:
            await self.seed.create(self.collection, body)
        else:
            meta["resourceVersion"] = resource_version(lease)
            await self.seed.request("PUT", lease_path(self.settings.namespace, self.member_name), body=body)
        await self._forget_dead_members()

    async def _forget_dead_members(self) -> None:
        now = self.clock()
        limit = STALE_MEMBER_DURATIONS * self.settings.lease_duration_s
        for name, m in list(self.members.items()):
            if now - m.changed_at < limit:
                continue
            del self.members[name]
            try:
                # On the version seen: a member that renewed meanwhile is not deleted.
                await self.seed.delete(
                    lease_path(self.settings.namespace, name),
                    {"preconditions": {"resourceVersion": m.version}},
                )
                log.info("member_forgotten", member=name, quiet_s=round(now - m.changed_at))
            except (Conflict, NotFound):
                pass

    async def release(self) -> None:
        """On a clean shutdown: every shard given back and the member Lease deleted, so the
        others take the shards at once and count one member less."""
        try:
            listed = await self.seed.get(self.collection, labelSelector=f"{GROUP}={self.base}")
            leases = {metadata(o).get("name", ""): o for o in listed.get("items") or ()}
            mine = [i for i, h in enumerate(self.holds) if h.mine() and self.names[i] in leases]
            await asyncio.gather(*(self._release(i, leases[self.names[i]]) for i in mine))
            await self.seed.delete(lease_path(self.settings.namespace, self.member_name))
        except KubeError as e:
            log.warning("shards_release_failed", error=str(e))
        for hold in self.holds:
            hold.given_up()
