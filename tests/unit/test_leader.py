"""Leader election against the fake API and a manual clock: acquire, renew, lose, the term's end."""

from __future__ import annotations

import asyncio
import contextlib
import math

import pytest

from aggregator.lead.leader import LeaderElector
from aggregator.model.settings import LeaderSettings
from core.errors import KubeError, NotFound
from tests.unit.fakekube import FakeKube, transport_error
from tests.unit.virtualtime import in_virtual_time, now
from tests.unit.world import Clock

PATH = "/apis/coordination.k8s.io/v1/namespaces/garden/leases/dwd-lease-aggregator"


def elector(kube: FakeKube, clock: Clock, identity: str) -> LeaderElector:
    return LeaderElector(kube, LeaderSettings(True, "garden"), identity=identity, clock=clock)


async def attempt(e: LeaderElector) -> None:
    with contextlib.suppress(KubeError):
        await e._try_once()


async def test_the_first_candidate_acquires_and_its_term_ends_a_renew_deadline_after_renewing() -> None:
    kube, clock = FakeKube(), Clock()
    a = elector(kube, clock, "a")
    assert (a.is_leader(), a.term_end()) == (False, -math.inf)
    await attempt(a)
    assert a.is_leader() and kube.objects[PATH]["spec"]["holderIdentity"] == "a"
    assert a.term_end() == clock() + 10.0
    clock.now += 9.9
    assert a.is_leader()
    clock.now += 0.1
    assert not a.is_leader()  # no renewal for the renew deadline: the term is over


@pytest.mark.parametrize(
    ("quiet_s", "takes_over"),
    [(14.9, False), (15.0, True)],  # the lease duration, by the standby's own clock
)
async def test_a_standby_takes_over_only_after_the_lease_duration(quiet_s: float, takes_over: bool) -> None:
    kube, clock = FakeKube(), Clock()
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    await attempt(a)
    await attempt(b)  # b sees a's renewTime for the first time now
    assert not b.is_leader()
    clock.now += quiet_s
    await attempt(b)
    assert b.is_leader() is takes_over
    # a stopped renewing more than a renew deadline before b could take over.
    assert not a.is_leader()


async def test_a_renewing_leader_keeps_its_lease() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    for _ in range(20):
        await attempt(a)
        await attempt(b)
        clock.now += 2.0
    assert kube.objects[PATH]["spec"]["holderIdentity"] == "a"
    assert kube.objects[PATH]["spec"]["leaseTransitions"] == 0
    assert not b.is_leader()


async def test_of_two_racing_candidates_one_wins() -> None:
    kube, clock = FakeKube(), Clock()
    a, b, c = elector(kube, clock, "a"), elector(kube, clock, "b"), elector(kube, clock, "c")
    await attempt(a)
    await asyncio.gather(attempt(b), attempt(c))
    clock.now += 15  # a is gone: both standbys see its lease expired
    puts = len([w for w in kube.writes if w[0] == "PUT"])
    await asyncio.gather(attempt(b), attempt(c))  # both read, then both write on what they read
    assert len([w for w in kube.writes if w[0] == "PUT"]) == puts + 1  # the second PUT conflicted
    assert [b.is_leader(), c.is_leader()].count(True) == 1
    assert kube.objects[PATH]["spec"]["leaseTransitions"] == 1


async def test_a_leader_that_cannot_renew_loses_its_term() -> None:
    kube, clock = FakeKube(), Clock()
    a = elector(kube, clock, "a")
    await attempt(a)
    kube.fail(error=transport_error)
    for _ in range(5):
        clock.now += 2.0
        await attempt(a)
    assert not a.is_leader()
    assert a.term_end() <= clock()


async def test_release_hands_over_at_once() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    await attempt(a)
    await a.release()
    assert not a.is_leader() and kube.objects[PATH]["spec"]["holderIdentity"] == ""
    await attempt(b)
    assert b.is_leader()


@in_virtual_time  # the loop's own timers, on a clock a loaded machine cannot slow
async def test_run_acquires_keeps_renewing_and_loses_the_term_when_the_seed_fails() -> None:
    kube = FakeKube()
    quick = LeaderSettings(True, "garden", lease_duration_s=0.6, renew_deadline_s=0.4, retry_period_s=0.05)
    a = LeaderElector(kube, quick, identity="a", clock=now)
    task = asyncio.create_task(a.run())
    try:
        await asyncio.sleep(0.3)
        assert a.is_leader()
        renewals = [w for w in kube.writes if w[0] == "PUT"]
        assert len(renewals) >= 3  # every retry period, on the resourceVersion it read
        kube.fail(error=transport_error)
        await asyncio.sleep(0.6)
        assert not a.is_leader()  # a renew deadline without a renewal ends the term
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_of_two_creating_at_once_the_second_conflicts_and_stays_standby() -> None:
    kube, clock = FakeKube(), Clock()
    a = elector(kube, clock, "a")
    # a read no lease; b created one before a's POST arrived.
    kube.fail("GET", PATH + "$", error=lambda: NotFound(404, "NotFound", PATH))
    kube.put(PATH, {"spec": {"holderIdentity": "b", "renewTime": "t"}})
    await attempt(a)
    assert not a.is_leader() and kube.objects[PATH]["spec"]["holderIdentity"] == "b"


async def test_release_leaves_a_lease_held_by_another_alone_and_survives_a_failing_seed() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = elector(kube, clock, "a"), elector(kube, clock, "b")
    await attempt(a)
    await b.release()  # not the leader: nothing to give up
    assert kube.objects[PATH]["spec"]["holderIdentity"] == "a"
    kube.objects[PATH]["spec"]["holderIdentity"] = "b"  # taken over meanwhile
    await a.release()
    assert kube.objects[PATH]["spec"]["holderIdentity"] == "b" and not a.is_leader()
    await attempt(a)
    clock.now += 15
    await attempt(a)  # b's renewTime never changed: a takes the lease back
    assert a.is_leader()
    kube.fail(error=transport_error)
    await a.release()  # logged, not raised
    assert not a.is_leader()
