"""The informer against the fake API: events parsed into views, a 410 re-lists, failures back off,
a watch that never ends is cut; and what Observed makes of nodes and leases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregator.model.backoff import Backoff
from aggregator.model.objects import NodeView
from aggregator.model.settings import WatchSettings
from aggregator.observe.watcher import Informer, Observed
from core.errors import ServerError
from core.lease import RENEW_INTERVAL, LeaseView, lease_metadata, leases_path, node_lease_path
from tests.unit.fakekube import FakeKube, server_error
from tests.unit.world import Clock

NS = "dwd-node-lease"
QUICK = WatchSettings(timeout_s=1.0, grace_s=0.2, backoff=Backoff(0.01, 0.02))


def lease(name: str, rv: str, renew: str = "2026-11-30T12:00:00.000000Z") -> dict[str, Any]:
    return {
        "metadata": {**lease_metadata(name), "resourceVersion": rv, "annotations": {RENEW_INTERVAL: "2s"}},
        "spec": {"renewTime": renew},
    }


class Recorder:
    def __init__(self) -> None:
        self.lists: list[list[LeaseView]] = []
        self.events: list[tuple[str, LeaseView]] = []
        self.restarts: list[str] = []

    def informer(self, kube: FakeKube, **kw: Any) -> Informer[LeaseView]:
        informer = Informer(
            kube,
            leases_path(NS),
            name="leases",
            parse=LeaseView.from_object,
            on_list=self.lists.append,
            on_event=lambda kind, view: self.events.append((kind, view)),
            settings=kw.pop("settings", QUICK),
            **kw,
        )
        informer.on_restart = self.restarts.append
        return informer


async def until(done: Callable[[], bool], timeout_s: float = 3.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if done():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not within the time")


async def run_until(informer: Informer[Any], done: Callable[[], bool]) -> None:
    task = asyncio.create_task(informer.run())
    try:
        await until(done)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_events_arrive_as_views_and_move_the_resource_version() -> None:
    kube, rec = FakeKube(), Recorder()
    kube.put(node_lease_path(NS, "n1"), lease("n1", "1"))
    kube.watches.append(
        [
            {"type": "MODIFIED", "object": lease("n1", "41", renew="2026-11-30T12:00:02.000000Z")},
            {"type": "ADDED", "object": {"metadata": {"resourceVersion": "42"}}},  # no name: skipped
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "43"}}},
            {"type": "DELETED", "object": lease("n1", "44")},
        ]
    )
    informer = rec.informer(kube)
    await run_until(informer, lambda: len(rec.events) == 2)
    assert [v.name for v in rec.lists[0]] == ["n1"]
    assert [(kind, view.name, view.renew_time) for kind, view in rec.events] == [
        ("MODIFIED", "n1", "2026-11-30T12:00:02.000000Z"),
        ("DELETED", "n1", "2026-11-30T12:00:00.000000Z"),
    ]
    assert informer.resource_version == "44"
    assert informer.synced.is_set() and not informer.failing


async def test_a_410_relists_and_other_failures_back_off_and_resume_without_a_list() -> None:
    kube, rec = FakeKube(), Recorder()
    kube.put(node_lease_path(NS, "n1"), lease("n1", "1"))
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    kube.watches.append([gone])
    informer = rec.informer(kube)
    task = asyncio.create_task(informer.run())
    try:
        await until(lambda: len(rec.lists) == 2)
        assert rec.restarts == ["gone"]
        rule = kube.fail("GET", r"\?watch", error=server_error)
        await until(lambda: rule.hits >= 3)
        assert informer.failing and not informer.fresh(60.0)
        assert "injected" in informer.last_error
        assert set(rec.restarts[1:]) == {"http-500"}
        assert len(rec.lists) == 2  # resumed from the resourceVersion, never re-listed
        kube.clear()
        await until(lambda: not informer.failing and informer.last_error == "")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_watch_that_runs_past_its_timeout_is_cut_and_counted_as_a_timeout() -> None:
    kube, rec = FakeKube(), Recorder()
    quick = WatchSettings(timeout_s=0.05, grace_s=0.05, backoff=Backoff(0.01, 0.01), timeout_jitter=0)
    informer = rec.informer(kube, settings=quick)

    async def endless(*_: Any, **kw: Any) -> Any:
        kw["on_open"]()
        await asyncio.Event().wait()
        yield {}

    kube.watch = endless  # type: ignore[method-assign]  # this server's watches, for this test
    await run_until(informer, lambda: len(rec.restarts) >= 2)
    assert set(rec.restarts) == {"timeout"}
    assert "no end 0.05s past its timeout of 0.05s" in informer.last_error


async def test_watches_started_together_do_not_restart_together() -> None:
    """Every target's watches start at once; asking the same timeout, 500 of them restarted in
    the same 0.3 s at 250 targets, a seed-wide outage's interlocks among them (bench/seed.py).
    Each restart draws its own, and the view's freshness allows for the longest."""
    kube, rec = FakeKube(), Recorder()
    settings = WatchSettings(timeout_s=10.0, grace_s=0.2, backoff=Backoff(0.01, 0.02), timeout_jitter=0.2)
    await run_until(rec.informer(kube, settings=settings), lambda: len(kube.watch_timeouts) >= 40)
    asked = kube.watch_timeouts
    # Whole seconds, as the API takes them, drawn anew at every restart.
    assert set(asked) == {10.0, 11.0, 12.0}, asked
    assert settings.fresh_s == pytest.approx(12.0 + settings.silence_s)


async def test_a_list_that_fails_or_has_no_items_is_not_fresh() -> None:
    kube, rec = FakeKube(), Recorder()
    informer = rec.informer(kube)
    kube.fail("GET", error=lambda: ServerError(503, "ServiceUnavailable", "etcd"))
    with pytest.raises(ServerError):
        await informer.list_now()
    assert informer.failing and not rec.lists
    kube.clear()
    kube.request = _answer({"kind": "Status"})  # type: ignore[method-assign]  # its answers, for this test
    with pytest.raises(Exception, match="no items"):
        await informer.list_now()


def _answer(body: dict[str, Any]) -> Callable[..., Any]:
    async def request(*_: Any, **__: Any) -> dict[str, Any]:
        return body

    return request


def test_observed_nodes_carry_their_uid_and_age_by_the_servers_clock() -> None:
    clock, wall = Clock(1000.0), datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    observed = Observed(clock=clock, wall=lambda: wall)
    created = (wall - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    node = {"metadata": {"name": "n1", "uid": "u1", "creationTimestamp": created}}
    observed.nodes_listed([NodeView.from_object(node)])
    assert observed.nodes["n1"].view.uid == "u1"
    assert observed.nodes["n1"].created_mono == 970.0
    observed.node_event("ADDED", NodeView("n2", uid="u2"))  # no creation time: as old as now
    assert observed.nodes["n2"].created_mono == 1000.0
    observed.node_event("DELETED", NodeView("n1"))
    assert set(observed.nodes) == {"n2"} and observed.changed.is_set()


def test_observed_leases_are_seen_renewed_when_renew_time_changes_on_our_clock() -> None:
    clock = Clock(1000.0)
    observed = Observed(clock=clock)
    observed.leases_listed([LeaseView("n1", renew_time="a", interval_s=2.0)])
    first = observed.leases["n1"]
    assert (first.seen_renewed_mono, first.paced_since_mono) == (1000.0, 1000.0)  # first sight: no record
    clock.now = 1005.0
    observed.lease_event("MODIFIED", LeaseView("n1", renew_time="a", interval_s=2.0))
    assert observed.leases["n1"].seen_renewed_mono == 1000.0  # the same renewTime: not renewed
    clock.now = 1006.0
    observed.lease_event("MODIFIED", LeaseView("n1", renew_time="b", interval_s=60.0))
    assert (observed.leases["n1"].seen_renewed_mono, observed.leases["n1"].paced_since_mono) == (
        1006.0,
        1006.0,
    )
    assert observed.lease_ages() == {"n1": 0.0}
    observed.lease_event("DELETED", LeaseView("n1"))
    assert observed.leases == {}
    observed.leases_listed([LeaseView("n2", renew_time="x", interval_s=2.0, renewed_after_interval=True)])
    assert observed.leases["n2"].paced_since_mono == float("-inf")  # the server's record vouches


def test_during_a_move_each_node_is_judged_by_its_later_renewal_of_the_two_layouts() -> None:
    """Ours and the old layout's lease of a node: the one seen renewed last counts (ours on a
    tie); the provisioner sees only ours."""
    clock = Clock(1000.0)
    observed = Observed(clock=clock)
    observed.leases_listed([LeaseView("n1", renew_time="a"), LeaseView("n2", renew_time="a")])
    observed.legacy_listed([LeaseView("n1", renew_time="x"), LeaseView("n3", renew_time="x")])
    assert observed.leases["n1"] is observed.own["n1"]  # a tie: ours
    assert observed.leases["n3"] is observed.legacy["n3"]  # no lease of ours yet: the old one
    assert set(observed.own) == {"n1", "n2"}
    clock.now = 1004.0
    observed.legacy_event("MODIFIED", LeaseView("n1", renew_time="y"))  # an old agent renews
    assert observed.lease_ages()["n1"] == 0.0 and observed.leases["n1"] is observed.legacy["n1"]
    clock.now = 1005.0
    observed.lease_event("MODIFIED", LeaseView("n1", renew_time="b"))  # its new agent takes over
    assert observed.leases["n1"] is observed.own["n1"]
    observed.legacy_listed([])  # the old namespace is gone
    assert set(observed.leases) == {"n1", "n2"} and observed.lease_ages()["n2"] == 5.0


def test_during_a_move_a_release_of_either_layouts_lease_releases_the_node() -> None:
    """An agent of 0.2.0 releases only its lease of ours on SIGTERM; the old layout's, written
    just after it in the same round, is the one judged: the node is released all the same. A
    successor's renewal of ours, later than that round, takes the node back."""
    clock = Clock(1000.0)
    observed = Observed(clock=clock)
    observed.leases_listed([LeaseView("n1", renew_time="a", interval_s=2.0)])
    clock.now = 1000.3
    observed.legacy_listed([LeaseView("n1", renew_time="x", interval_s=2.0)])
    assert not observed.leases["n1"].view.released
    clock.now = 1001.0
    observed.lease_event("MODIFIED", LeaseView("n1", renew_time="a", interval_s=2.0, released=True))
    judged = observed.leases["n1"]
    assert judged.view.released and judged.view.renew_time == "x"  # the old layout's renewal
    clock.now = 1020.0
    observed.lease_event("MODIFIED", LeaseView("n1", renew_time="b", interval_s=2.0))
    assert not observed.leases["n1"].view.released and observed.leases["n1"] is observed.own["n1"]
    # An old agent that released the old layout's lease only, long before ours was renewed:
    # ours, renewed since, stands.
    observed.legacy_event("MODIFIED", LeaseView("n1", renew_time="x", interval_s=2.0, released=True))
    assert not observed.leases["n1"].view.released


def test_a_round_of_renewals_is_told_by_the_nodes_clock_not_by_when_the_watches_delivered_it() -> None:
    """Found by the model: the two layouts' watches delivered an old agent's round of renewals
    more than an interval apart, so its release of ours was taken for a successor's renewal of
    the old layout's and the node counted stale with no witness to ask. Stamped by one agent in
    one round, they are one round however late one arrives; a successor's renewal is not."""
    clock = Clock(1000.0)
    observed = Observed(clock=clock)
    ours, old = "2026-12-08T00:00:00.000000Z", "2026-12-08T00:00:00.020000Z"
    observed.leases_listed([LeaseView("n1", renew_time=ours, interval_s=0.5)])
    observed.lease_event("MODIFIED", LeaseView("n1", renew_time=ours, interval_s=0.5, released=True))
    clock.now = 1002.0  # the old layout's watch, behind
    observed.legacy_listed([LeaseView("n1", renew_time=old, interval_s=0.5)])
    assert observed.leases["n1"].view.released
    clock.now = 1006.0
    successor = "2026-12-08T00:00:06.000000Z"
    observed.legacy_event("MODIFIED", LeaseView("n1", renew_time=successor, interval_s=0.5))
    assert not observed.leases["n1"].view.released


def test_a_renewal_does_not_wake_the_provisioner_anything_else_does() -> None:
    """At 5000 nodes every renewal waking the provisioner made its pass over every node run at
    the renewal rate (bench.scale: 70 % of a core at a constant write rate)."""
    observed = Observed(clock=Clock(1000.0))
    observed.leases_listed([LeaseView("n1", renew_time="a", interval="2s", interval_s=2.0)])
    observed.changed.clear()
    observed.lease_event("MODIFIED", LeaseView("n1", renew_time="b", interval="2s", interval_s=2.0))
    assert not observed.changed.is_set()
    # The agent's evidence of an unseen renewal, written by one renewal and cleared by the next.
    evidence = LeaseView(
        "n1", renew_time="b2", interval="2s", interval_s=2.0, previous_renew="b", annotated=True
    )
    observed.lease_event("MODIFIED", evidence)
    observed.lease_event(
        "MODIFIED", LeaseView("n1", renew_time="b3", interval="2s", interval_s=2.0, annotated=True)
    )
    assert not observed.changed.is_set()
    observed.lease_event("MODIFIED", LeaseView("n1", renew_time="c", interval="1m", interval_s=60.0))
    assert observed.changed.is_set()
    observed.changed.clear()
    observed.lease_event("ADDED", LeaseView("n2", renew_time="a"))
    assert observed.changed.is_set()
    observed.changed.clear()
    observed.lease_event("DELETED", LeaseView("n2"))
    assert observed.changed.is_set()
