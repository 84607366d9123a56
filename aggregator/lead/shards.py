"""The targets shared out over the aggregator's replicas (``DWD_SHARDS``): a fixed number of
shard Leases, each held as the leader's Lease is (aggregator/lead/leader.py ``Hold``).

A target belongs to the shard its name hashes to (``shard_of``); each replica holds one of a
fixed set of member Leases, takes free shards while it holds fewer than its share
(ceil(shards / live members)) and gives back what it holds beyond it, never in its first
lease duration. Every replica watches and judges every target; the holder of a target's
shard alone provisions, checks the interlocks, writes and reports, and shard 0's holder
sweeps the records of removed targets. The rules, the seed's cost and the measurements:
docs/scale.md, "Shards: the outage's work shared out over replicas".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any

from aggregator.kube.client import KubeApi
from aggregator.lead.leader import GROUP, ROLE, Hold, LeaderRecord, Others, list_ours, new_identity, role
from aggregator.lead.scope import Scope
from aggregator.model.objects import metadata, resource_version
from aggregator.model.settings import LeaderSettings
from core import logs
from core.errors import Conflict, KubeError, NotFound
from core.lease import format_micro_time, lease_path, leases_path

log = logs.get("shards")

# On shard Leases: the DWD_SHARDS they were written under (each count cuts the targets anew).
COUNT = "dwd-lease.gardener.cloud/shards"
# Replicas counted when sharing out: more than a seed's aggregator runs. One beyond them holds
# no member Lease and is not counted; it still takes shards nobody holds.
MEMBER_SLOTS = 8


def shard_of(name: str, count: int) -> int:
    """The shard a target belongs to: a stable hash of its name (Python's ``hash`` is salted per
    process, and every replica must agree)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % count


def lease_names(base: str, shards: int) -> tuple[list[str], list[str]]:
    """The shard Leases' names and the member Leases' (the Role lists the same)."""
    return [f"{base}-shard-{i}" for i in range(shards)], [f"{base}-member-{i}" for i in range(MEMBER_SLOTS)]


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return metadata(obj).get("annotations") or {}


def _preference(identity: str, name: str) -> bytes:
    # Rendezvous order: each replica its own ranking of the Leases, so two rarely reach for one.
    return hashlib.sha256(f"{identity}/{name}".encode()).digest()


class Shards:
    def __init__(
        self,
        seed: KubeApi,
        settings: LeaderSettings,
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
        self.names, self.member_names = lease_names(name, count)
        self.holds = [Hold(self.identity, settings, clock) for _ in self.names]
        self._scopes = [h.scope() for h in self.holds]
        self.members = [Hold(self.identity, settings, clock) for _ in self.member_names]
        # When the first LIST was answered (None: not yet).
        self.listed_at: float | None = None
        # Leases of another configuration that are held: take nothing while there are.
        self.conflicting: list[str] = []
        self._others = Others(self.identity, settings, clock)
        self._member_counts: dict[str, str] = {}  # member Lease -> the shard count it was written under
        self._excess_since: float | None = None
        self._member_at = -math.inf  # when our member Lease was last renewed
        self._held_before: tuple[int, ...] = ()

    # -- what the targets ask

    def leads(self, target: str) -> bool:
        return self.holds[shard_of(target, self.count)].holds()

    def term_end(self, target: str) -> float:
        return self.holds[shard_of(target, self.count)].term_end()

    def scope(self, target: str) -> Scope:
        """A target acts in its shard's scope."""
        return self._scopes[shard_of(target, self.count)]

    def sweeps(self) -> bool:
        return self.holds[0].holds()

    def leading(self) -> bool:
        """Whether this replica acts for any target now (holds any shard)."""
        return any(h.holds() for h in self.holds)

    def held(self) -> list[int]:
        return [i for i, h in enumerate(self.holds) if h.holds()]

    def live_members(self) -> int:
        """The member Leases held by someone who renews them under the same shard count (one
        of another count takes nothing here); this replica always counts."""
        others = sum(
            1
            for name, m in zip(self.member_names, self.members, strict=True)
            if m.holder and not m.mine() and not m.free() and self._member_counts.get(name) == str(self.count)
        )
        return 1 + others

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
        # A step cut short leaves every term to end on its own: one that ran past the renew
        # deadline could only renew what may already be lost.
        limit_s = self.settings.renew_deadline_s - self.settings.retry_period_s
        while True:
            try:
                async with asyncio.timeout(limit_s):
                    await self.step()
            except KubeError as e:
                log.warning("shards_failed", error=str(e), identity=self.identity)
            except TimeoutError:
                log.warning("shards_failed", error=f"no answer within {limit_s:g}s", identity=self.identity)
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
        leases = await list_ours(self.seed, self.collection, self.base)
        for name, hold in self._every():
            if name in leases:
                hold.observe(LeaderRecord.from_object(leases[name]))
            else:
                hold.vanish()
        self._member_counts = {
            n: _annotations(leases[n]).get(COUNT, "") for n in self.member_names if n in leases
        }
        if self.listed_at is None:
            self.listed_at = sent_at  # the first lease duration counts from the first answer
        self._see_other_configurations(leases)
        writes: list[Coroutine[Any, Any, object]] = [self._member(leases, now_wall, sent_at)]
        mine = [i for i, h in enumerate(self.holds) if h.mine()]
        give_back = self._give_back(mine)
        for i in mine:
            lease = leases[self.names[i]]
            if i == give_back:
                writes.append(self._release(self.names[i], self.holds[i], lease))
            else:
                writes.append(self._write(self.names[i], self.holds[i], lease, now_wall, sent_at))
        for i in self._to_take(len(mine)):
            writes.append(
                self._write(self.names[i], self.holds[i], leases.get(self.names[i]), now_wall, sent_at)
            )
        for result in await asyncio.gather(*writes, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(result, KubeError):
                raise result
            if isinstance(result, KubeError):
                log.warning("shard_write_failed", error=str(result))

    def _see_other_configurations(self, leases: Mapping[str, Mapping[str, Any]]) -> None:
        """Held Leases of another configuration: the leader Lease (``DWD_SHARDS`` 1), or shards
        of another count, which cut the targets differently. While one is held, taking a shard
        could make two writers of a target: a rollout that changes the count waits for them."""
        others = {
            name: obj
            for name, obj in leases.items()
            if role(obj) == "leader"
            or (role(obj) == "shard" and _annotations(obj).get(COUNT) != str(self.count))
        }
        held = self._others.held(others)
        if held != self.conflicting:
            if held:
                log.error("shards_blocked", by=held, shards=self.count, why="held under another DWD_SHARDS")
            else:
                log.info("shards_unblocked", shards=self.count)
        self.conflicting = held

    def _every(self) -> list[tuple[str, Hold]]:
        return list(zip([*self.names, *self.member_names], [*self.holds, *self.members], strict=True))

    async def _member(self, leases: Mapping[str, Mapping[str, Any]], now_wall: str, sent_at: float) -> None:
        """Our member Lease renewed every third of a lease duration, or a free one taken."""
        held = next((i for i, m in enumerate(self.members) if m.mine()), None)
        if held is not None and sent_at - self._member_at < self.settings.lease_duration_s / 3:
            return
        if held is None:
            free = [i for i, m in enumerate(self.members) if m.free()]
            if not free:
                return  # more replicas than member Leases: this one is not counted
            held = min(free, key=lambda i: _preference(self.identity, self.member_names[i]))
        name = self.member_names[held]
        if await self._write(name, self.members[held], leases.get(name), now_wall, sent_at):
            self._member_at = sent_at

    def _to_take(self, holding: int) -> list[int]:
        """The free shards to reach for now, most preferred first, up to the share."""
        if self.listed_at is None or self.clock() - self.listed_at < self.settings.lease_duration_s:
            return []  # the first lease duration: every live member is seen before anything is taken
        if self.conflicting:
            return []
        free = [i for i, h in enumerate(self.holds) if h.free()]
        free.sort(key=lambda i: _preference(self.identity, self.names[i]))
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
        return max(mine, key=lambda i: _preference(self.identity, self.names[i]))

    def _body(self, name: str, lease: Mapping[str, Any] | None, spec: dict[str, Any]) -> dict[str, Any]:
        role = "member" if name in self.member_names else "shard"
        meta: dict[str, Any] = {
            "name": name,
            "labels": {GROUP: self.base, ROLE: role},
            "annotations": {COUNT: str(self.count)},
        }
        if lease is not None:
            meta["resourceVersion"] = resource_version(lease)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def _write(
        self, name: str, hold: Hold, lease: Mapping[str, Any] | None, now_wall: str, sent_at: float
    ) -> bool:
        """Renew or take a Lease: a PUT on the version listed, or its creation. Whether it is ours."""
        record = None if lease is None else LeaderRecord.from_object(lease)
        body = self._body(name, lease, hold.spec(record, now_wall))
        try:
            if lease is None:
                await self.seed.create(self.collection, body)
            else:
                await self.seed.request("PUT", lease_path(self.settings.namespace, name), body=body)
        except (Conflict, NotFound):
            return False  # another replica wrote it first: theirs, or free again next period
        hold.renewed(sent_at, now_wall)
        return True

    async def _release(self, name: str, hold: Hold, lease: Mapping[str, Any]) -> None:
        """Give a Lease back: no more acting on it from this moment; written free only once every
        write made under it has a known fate, else left to expire (aggregator/lead/scope.py)."""
        hold.given_up()
        if not hold.writes.idle:
            log.info("lease_left_to_expire", lease=name, why="a write may still land", identity=self.identity)
            return
        spec = {**dict(lease.get("spec") or {}), "holderIdentity": ""}
        with contextlib.suppress(Conflict, NotFound):
            await self.seed.request(
                "PUT", lease_path(self.settings.namespace, name), body=self._body(name, lease, spec)
            )
        log.info("lease_given_back", lease=name, share=self.share(), identity=self.identity)

    async def release(self) -> None:
        """On a clean shutdown: every shard and the member Lease given back, so the others take
        the shards at once and count one member less; each shard once its writes in flight have
        ended (by its term's end), and not at all while one may still land."""
        try:
            leases = await list_ours(self.seed, self.collection, self.base)
            held = [
                (name, hold)
                for name, hold in self._every()
                if name in leases and LeaderRecord.from_object(leases[name]).holder == self.identity
            ]
            for _, hold in held:
                hold.given_up()
            await asyncio.gather(*(h.writes.settled(self.settings.renew_deadline_s) for _, h in held))
            await asyncio.gather(*(self._release(name, hold, leases[name]) for name, hold in held))
        except KubeError as e:
            log.warning("shards_release_failed", error=str(e))
        for hold in (*self.holds, *self.members):
            hold.given_up()
