"""Shard Leases against the fake API and a manual clock: the share, the first lease duration,
hand-over without overlap, a dead replica's shards, a clean release, dead members forgotten."""

from __future__ import annotations

import asyncio
import collections
import itertools
import pathlib

import pytest
import yaml

from aggregator.lead.leader import GROUP, ROLE
from aggregator.lead.shards import Shards, lease_names, shard_of
from aggregator.model.settings import MAX_SHARDS, LeaderSettings, Settings
from core.errors import ConfigError
from core.lease import lease_path
from tests.unit.fakekube import FakeKube
from tests.unit.world import Clock


def replica(kube: FakeKube, clock: Clock, identity: str, count: int = 8) -> Shards:
    return Shards(kube, LeaderSettings(True, "garden", shards=count), count, identity=identity, clock=clock)


async def period(clock: Clock, *replicas: Shards, times: int = 1) -> None:
    """Retry periods in which ``replicas`` step; no shard is ever held by two at any moment."""
    for _ in range(times):
        clock.now += 2.0
        for r in replicas:
            await r.step()
            assert_no_overlap(*replicas)


def assert_no_overlap(*replicas: Shards) -> None:
    holders = collections.Counter(i for r in replicas for i in r.held())
    assert all(n == 1 for n in holders.values()), holders


def test_a_target_belongs_to_one_shard_whatever_the_replicas_and_the_names_spread() -> None:
    names = [f"shoot--p{i}--s" for i in range(250)]
    counts = collections.Counter(shard_of(n, 8) for n in names)
    assert set(counts) == set(range(8))
    assert max(counts.values()) < 2 * 250 / 8  # no shard carries twice its share
    assert [shard_of(n, 8) for n in names] == [shard_of(n, 8) for n in names]


async def test_a_lone_replica_takes_nothing_in_its_first_lease_duration_then_every_shard() -> None:
    kube, clock = FakeKube(), Clock()
    a = replica(kube, clock, "a")
    await period(clock, a, times=8)  # 14 s since its first LIST was answered: under a lease duration
    assert a.held() == []
    await period(clock, a)
    assert a.held() == list(range(8))
    shard = kube.objects[lease_path("garden", "dwd-lease-aggregator-shard-3")]
    assert shard["metadata"]["labels"] == {GROUP: "dwd-lease-aggregator", ROLE: "shard"}
    assert shard["spec"]["holderIdentity"] == "a"


async def test_two_replicas_started_together_share_the_shards_without_ever_overlapping() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = replica(kube, clock, "a"), replica(kube, clock, "b")
    await period(clock, a, b, times=30)
    assert sorted(a.held() + b.held()) == list(range(8))
    assert (len(a.held()), len(b.held())) == (4, 4)
    assert a.live_members() == b.live_members() == 2


async def test_a_newcomer_gets_its_share_one_shard_at_a_time_and_never_a_shard_still_held() -> None:
    kube, clock = FakeKube(), Clock()
    a = replica(kube, clock, "a")
    await period(clock, a, times=10)
    assert len(a.held()) == 8
    b = replica(kube, clock, "b")
    held_by_a = []
    for _ in range(30):
        await period(clock, a, b)
        held_by_a.append(len(a.held()))
    assert (len(a.held()), len(b.held())) == (4, 4)
    # Given back one a retry period, once the excess has lasted a lease duration.
    steps = [x - y for x, y in itertools.pairwise(held_by_a)]
    assert max(steps) == 1 and held_by_a[:7] == [8] * 7


async def test_a_dead_replicas_shards_are_taken_after_a_lease_duration_and_its_term_ended_first() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = replica(kube, clock, "a"), replica(kube, clock, "b")
    await period(clock, a, b, times=30)
    lost = a.held()
    # a stops (SIGKILL, a partition): only b steps from now on.
    for seconds in range(2, 30, 2):
        await period(clock, b)
        assert_no_overlap(a, b)
        if seconds < 14:
            assert not set(lost) & set(b.held())
    assert sorted(b.held()) == list(range(8))
    assert a.held() == []


async def test_a_released_replicas_shards_are_taken_at_the_next_period() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = replica(kube, clock, "a"), replica(kube, clock, "b")
    await period(clock, a, b, times=30)
    await a.release()
    assert a.held() == []
    holders = {p.rsplit("/", 1)[1]: o["spec"]["holderIdentity"] for p, o in kube.objects.items()}
    assert "a" not in holders.values()  # its shards and its member Lease given back
    await period(clock, b)
    assert sorted(b.held()) == list(range(8))
    assert b.live_members() == 1


async def test_of_two_replicas_reaching_for_a_free_shard_at_once_one_gets_it() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = replica(kube, clock, "a", count=1), replica(kube, clock, "b", count=1)
    await asyncio.gather(a.step(), b.step())
    clock.now += 16
    await asyncio.gather(a.step(), b.step())
    assert len(a.held()) + len(b.held()) == 1


async def test_a_dead_replicas_member_lease_stops_counting_after_a_lease_duration_and_is_reused() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = replica(kube, clock, "a"), replica(kube, clock, "b")
    await period(clock, a, b, times=10)
    assert a.live_members() == 2
    await period(clock, a, times=10)  # b is gone: its member Lease stands still
    assert a.live_members() == 1 and sorted(a.held()) == list(range(8))
    members = {p for p, o in kube.objects.items() if o["metadata"]["labels"][ROLE] == "member"}
    c = replica(kube, clock, "c")
    await period(clock, a, c, times=20)
    # The fixed set of member Leases: c took a free one (b's, or another), none was added.
    assert {p for p, o in kube.objects.items() if o["metadata"]["labels"][ROLE] == "member"} <= {
        lease_path("garden", n) for n in lease_names("dwd-lease-aggregator", 8)[1]
    }
    assert len(members) == 2 and a.live_members() == c.live_members() == 2
    assert (len(a.held()), len(c.held())) == (4, 4)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"DWD_SHARDS": "4"}, "DWD_SHARDS: more than one shard needs DWD_LEADER_ELECTION=true"),
        ({"DWD_SHARDS": "0", "DWD_LEADER_ELECTION": "true"}, "DWD_SHARDS: 0 is below the minimum 1"),
        ({"DWD_SHARDS": "17", "DWD_LEADER_ELECTION": "true"}, "DWD_SHARDS: 17 is above the maximum 16"),
        ({"DWD_SHARDS": "x", "DWD_LEADER_ELECTION": "true"}, "DWD_SHARDS: 'x' is not an integer"),
    ],
)
def test_a_bad_shard_count_is_named(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        Settings.from_env({"DWD_SHOOT_KUBECONFIG": "/k", "DWD_NAMESPACE": "ns", **env})
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems


def test_the_seed_role_names_every_lease_the_shards_may_write_and_no_other() -> None:
    """Update is granted by name alone: a shard count the Role does not list would be a 403 on
    the first renewal, and a wider grant would let the aggregator write gardenlet's Leases."""
    rbac = pathlib.Path(__file__).resolve().parents[2] / "manifests" / "seed" / "rbac.yaml"
    role = next(
        d
        for d in yaml.safe_load_all(rbac.read_text())
        if d["kind"] == "Role" and d["metadata"]["name"] == "dwd-lease-aggregator-leader-election"
    )
    named = [set(r["resourceNames"]) for r in role["rules"] if "update" in r["verbs"]]
    shards, members = lease_names("dwd-lease-aggregator", MAX_SHARDS)
    assert named == [{"dwd-lease-aggregator", *shards, *members}]


async def test_a_term_counts_from_when_the_renewal_was_sent_not_when_it_was_answered() -> None:
    """A renewal answered late may have landed early: a standby counts from when it saw it."""
    kube, clock = FakeKube(), Clock()
    a = replica(kube, clock, "a", count=1)
    await period(clock, a, times=9)
    assert a.held() == [0]

    def slow(method: str, _path: str) -> None:
        if method == "PUT":
            clock.now += 3.0  # the answer takes 3 s

    kube.on_request = slow
    clock.now += 2.0
    sent = clock()
    await a.step()
    assert a.holds[0].term_end() == sent + 10.0


async def test_a_deleted_shard_lease_is_given_up_at_once_and_taken_only_a_lease_duration_later() -> None:
    """Its holder may act until its term ends: a Lease deleted by hand is no free shard."""
    kube, clock = FakeKube(), Clock()
    a, b = replica(kube, clock, "a", count=2), replica(kube, clock, "b", count=2)
    await period(clock, a, b, times=20)
    shard = next(i for i in range(2) if i in a.held())
    del kube.objects[lease_path("garden", f"dwd-lease-aggregator-shard-{shard}")]
    await period(clock, b)  # b sees it gone first: a still holds it by its term
    assert shard in a.held() and shard not in b.held()
    await period(clock, b, a)
    assert shard not in a.held()  # a saw it gone: it stops acting at once
    for _ in range(6):
        await period(clock, b, a)
        assert shard not in b.held()  # under a lease duration since it went
    await period(clock, b, a, times=2)
    assert shard in a.held() + b.held()


async def test_shards_are_not_taken_while_a_leader_of_one_lease_or_another_shard_count_holds() -> None:
    """A rollout that changes DWD_SHARDS: a leader (or shards cut by another count) covers the
    same targets; taking shards beside it would make two writers of them."""
    from aggregator.lead.leader import LeaderElector

    kube, clock = FakeKube(), Clock()
    leader = LeaderElector(kube, LeaderSettings(True, "garden"), identity="old", clock=clock)
    await leader._try_once()
    assert leader.is_leader()
    new = replica(kube, clock, "new", count=4)
    for _ in range(15):
        clock.now += 2.0
        await leader._try_once()
        await new.step()
        assert new.held() == [] and new.conflicting == ["dwd-lease-aggregator"]
    await period(clock, new, times=9)  # the old leader is gone: a lease duration, then the shards
    assert new.held() == [0, 1, 2, 3]
    other = replica(kube, clock, "other", count=8)
    await period(clock, new, other, times=12)
    assert other.held() == [] and len(other.conflicting) == 4
    # Sharding turned off again: the leader waits while the shards are held.
    back = LeaderElector(kube, LeaderSettings(True, "garden"), identity="back", clock=clock)
    for _ in range(10):
        clock.now += 2.0
        await new.step()
        await back._try_once()
        assert not back.is_leader()
    await new.release()
    clock.now += 2.0
    await back._try_once()
    assert back.is_leader()
