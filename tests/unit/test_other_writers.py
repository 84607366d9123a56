"""Safe in a seed that others write too: dependency-watchdog, operators, gardenlet, restarts.

One test per defect of the review (issue "Safe in a seed that others write too"): the Target
(or the Fleet) driven against the fake seed and shoot of tests/unit/world.py, at the defaults
(aggregator/model/settings.py; MCM 30 s after KCM). Other writers
are played with dependency-watchdog v1.7.0's own writes (``World.dwd_scale_down``,
``World.dwd_scale_up``) and an operator's ``kubectl scale`` (``World.scale``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web

from aggregator.fleet import Fleet, Running
from aggregator.lead.scope import Alone, Scope
from aggregator.model.dependents import DEFAULT_DEPENDENTS, Dependent, Step
from aggregator.model.records import IGNORE_SCALING, MELTDOWN, RECORD, REPLICAS, Record, record_marks
from aggregator.model.settings import DeciderSettings
from aggregator.model.verdict import Phase
from aggregator.observe.sources import Polled, TargetSpec
from aggregator.ops.metrics import AggregatorMetrics
from aggregator.shoot import Shared
from core.lease import DEFAULT_LEASE_NAMESPACE, node_lease_path
from testenv.kube.controllers import CA, CONTROLLERS, DOWN, KCM, MCM
from tests.unit.world import NS, World, deployment_path, with_settings


def ours(w: World, name: str) -> dict[str, Any] | None:
    """Our record on a dependent, parsed; None when it carries none."""
    text = (w.seed.objects[deployment_path(name)]["metadata"].get("annotations") or {}).get(RECORD)
    return None if text is None else dict(json.loads(text))


def seed_writes(w: World, since: int = 0, name: str = "") -> list[tuple[str, str, Any]]:
    """The writes to the seed's Deployments (``name``'s alone when given) since mark ``since``."""
    return [x for x in w.seed.writes[since:] if f"/deployments/{name}" in x[1]]


def events(w: World, since: int = 0) -> list[str]:
    return [
        str(body.get("message")) for method, path, body in w.seed.writes[since:] if path.endswith("/events")
    ]


# -- 1: dependency-watchdog's leftover `replicas` is not our record


@pytest.mark.parametrize("leftover", [{KCM: "1", MCM: "2", CA: "1"}, {CA: "1"}], ids=["all", "ca"])
async def test_dependency_watchdogs_leftover_is_not_our_record(leftover: dict[str, str]) -> None:
    w = World()
    for name, value in leftover.items():
        w.annotate(name, {REPLICAS: value})  # DWD healed this shoot once; its scale-up left these
    await w.run(40)
    assert not w.ever_scaled_down(), w.trace[-1]
    assert w.target.memory.phase is Phase.HEALTHY
    # Someone else's: left as it is, shown and counted.
    assert {n: w.annotations(n) for n in leftover} == {n: {REPLICAS: v} for n, v in leftover.items()}
    assert not seed_writes(w)
    snapshot = w.target.snapshot()["dependents"]
    assert {n for n, d in snapshot.items() if d["foreign"]} == set(leftover)
    assert w.target.metrics.foreign_records.get(target="shoot") == len(leftover)


async def test_a_takeover_on_a_shoot_with_dependency_watchdogs_leftover_lowers_nothing() -> None:
    w = World()
    for name in CONTROLLERS:
        w.annotate(name, {REPLICAS: "1"})
    w.leader = False
    await w.run(15)  # a standby, judging all along
    w.leader = True  # the rolling update's takeover
    await w.run(30)
    assert not w.ever_scaled_down(), w.trace[-1]


# -- 2: the count recorded is the count at the moment of the scale-down


async def test_the_count_at_the_scale_down_is_what_comes_back() -> None:
    w = World()
    w.annotate(KCM, {REPLICAS: "1"})  # left by DWD from an outage when KCM ran 1
    await w.settle()
    await w.outage()
    record = ours(w, KCM)
    assert record is not None and record["replicas"] == 3, record
    assert w.annotations(KCM)[REPLICAS] == "3"  # DWD's key beside it, for gardenlet
    w.alive |= set(w.names)
    await w.until(w.restored, 80, "every controller restored")
    assert w.replicas()[KCM] == 3


# -- 3: dry-run writes nothing at all


async def test_dry_run_writes_nothing_while_dependency_watchdog_protects_an_outage() -> None:
    w = World(dry_run=True)
    await w.settle()
    w.alive -= set(w.names[:7])  # a real outage ...
    for name in (MCM, CA, KCM):
        w.dwd_scale_down(name)  # ... that DWD protects
    mark = len(w.seed.writes)
    await w.run(120)
    assert w.replicas() == DOWN
    assert w.seed.writes[mark:] == []  # no scale, no annotation, no Event
    assert w.target.memory.phase is Phase.DOWN  # it decides, and says so


async def test_dry_run_writes_nothing_to_what_an_earlier_run_scaled_down() -> None:
    w = World()
    await w.settle()
    await w.outage()
    w.new_target(dry_run=True)
    mark = len(w.seed.writes)
    w.alive |= set(w.names)
    await w.run(90)
    assert w.seed.writes[mark:] == []
    assert w.replicas() == DOWN  # held as found: the next real run restores it
    assert w.target.memory.phase is Phase.HEALTHY


# -- 4: a start leaves another writer's scale-down alone


async def test_a_start_leaves_another_writers_scale_down_alone() -> None:
    w = World()
    for name in (MCM, CA, KCM):
        w.dwd_scale_down(name)  # DWD's own probe fails; our leases are fine
    await w.run(60)
    assert w.replicas() == DOWN
    assert {n: w.annotations(n) for n in CONTROLLERS} == {
        n: {REPLICAS: str(r), MELTDOWN: ""} for n, r in CONTROLLERS.items()
    }
    assert not seed_writes(w)


# -- 5: a start in the scale-up window lowers nothing


async def _in_the_scale_up_window(w: World) -> int:
    await w.settle()
    await w.outage()
    w.alive |= set(w.names)
    await w.until(lambda: w.replicas()[KCM] == 3, 40, "KCM back")
    assert w.replicas()[MCM] == 0 and ours(w, MCM) is not None  # MCM waits its 30 s
    return len(w.trace)


async def test_a_restart_in_the_scale_up_window_lowers_nothing() -> None:
    w = World()
    mark = await _in_the_scale_up_window(w)
    w.new_target()
    await w.until(w.restored, 90, "the scale-up finished")
    assert all(r[KCM] == 3 for _, r in w.trace[mark:]), [r for _, r in w.trace[mark:]]


async def test_a_missed_leader_term_in_the_scale_up_window_lowers_nothing() -> None:
    w = World()
    mark = await _in_the_scale_up_window(w)
    w.leader = False
    await w.step()
    w.leader = True
    await w.until(w.restored, 90, "the scale-up finished")
    assert all(r[KCM] == 3 for _, r in w.trace[mark:]), [r for _, r in w.trace[mark:]]


# -- every combination of what a start finds, on a healthy shoot and in an outage


def _found(w: World, found: str) -> None:
    """What a start finds on the seed: records of ours on some dependents, on all, or somebody
    else's (dependency-watchdog holding the shoot down)."""
    held = {
        "nothing": (),
        "ours on MCM": (MCM,),  # a scale-down that got as far as level 0 before a crash
        "ours on all": tuple(CONTROLLERS),
        "ours on MCM and CA, KCM back": (MCM, CA),  # the scale-up window
    }.get(found, ())
    for name in held:
        w.annotate(name, record_marks(Record(CONTROLLERS[name], "shoot")))
        w.seed.objects[deployment_path(name)]["metadata"]["labels"] = {RECORD: "true"}
        w.scale(name, 0)
    if found == "somebody else's":
        for name in CONTROLLERS:
            w.dwd_scale_down(name)


FOUND = ["nothing", "ours on MCM", "ours on all", "ours on MCM and CA, KCM back", "somebody else's"]


@pytest.mark.parametrize("found", FOUND)
async def test_a_start_on_a_healthy_shoot_lowers_nothing_and_restores_only_ours(found: str) -> None:
    w = World()
    _found(w, found)
    start = w.replicas()
    await w.run(60)
    lowered = [r for _, r in w.trace if any(r[n] < start[n] for n in CONTROLLERS)]
    assert not lowered, lowered[0]
    if found == "somebody else's":
        assert w.replicas() == DOWN and not seed_writes(w)  # not ours: left to its writer
    else:
        assert w.restored(), (w.replicas(), {n: w.annotations(n) for n in CONTROLLERS})


@pytest.mark.parametrize("found", FOUND)
async def test_a_start_in_an_outage_lowers_only_after_a_confirmed_verdict(found: str) -> None:
    w = World()
    _found(w, found)
    w.alive -= set(w.names[:7])
    start = w.replicas()
    await w.run(40)
    first_lowered = next((t for t, r in w.trace if any(r[n] < start[n] for n in CONTROLLERS)), None)
    if found not in {"ours on all", "somebody else's"}:
        # Nothing before a lease duration of fresh view, a lease duration and the confirm period.
        verdict_s = DeciderSettings().lease_duration_s + DeciderSettings().confirm_period_s
        assert first_lowered is not None and first_lowered - 1000 >= verdict_s, first_lowered
    assert w.replicas() == DOWN
    if found == "somebody else's":
        assert not seed_writes(w)


# -- 6: ignore-scaling keeps the record and the resource untouched


async def test_ignore_scaling_keeps_the_record_and_the_resource_untouched() -> None:
    w = World()
    await w.settle()
    await w.outage()
    w.annotate(KCM, {IGNORE_SCALING: "true"})  # the operator takes KCM over while it is at 0
    mark = len(w.seed.writes)
    w.alive |= set(w.names)
    await w.until(lambda: (w.replicas()[MCM], w.replicas()[CA]) == (2, 1), 60, "MCM and CA restored")
    await w.run(15)
    assert [x for x in seed_writes(w, mark, KCM) if x[0] == "PATCH"] == []
    assert w.replicas()[KCM] == 0
    assert ours(w, KCM) == {**(ours(w, KCM) or {}), "replicas": 3}
    w.annotate(KCM, {IGNORE_SCALING: None})  # handed back
    await w.until(w.restored, 30, "KCM restored once ignore-scaling is gone")


# -- 7: someone else's replicas while we hold a dependent down


async def test_an_operators_scale_while_held_down_is_lowered_reported_and_restored() -> None:
    w = World()
    await w.settle()
    await w.outage()
    mark = len(w.seed.writes)
    w.scale(KCM, 5)  # kubectl scale --replicas=5 during the outage
    await w.run(12)
    assert w.replicas()[KCM] == 0  # protection holds ...
    record = ours(w, KCM)
    assert record is not None and record["replicas"] == 5  # ... and what the operator wanted is kept
    assert w.annotations(KCM)[REPLICAS] == "5"
    assert [e for e in events(w, mark) if "raised to 5 by someone else" in e], events(w, mark)
    w.alive |= set(w.names)
    await w.until(lambda: w.replicas() == {**CONTROLLERS, KCM: 5} and not w.annotations(KCM), 80, "restored")


async def test_an_operators_scale_lowered_again_by_dependency_watchdog_before_we_looked_is_restored() -> None:
    """Found by the fault suite: held down, an operator raises MCM to 4, and before our next
    look (every 10 s while held down) dependency-watchdog lowers it again, recording the 4 it
    took in its ``replicas`` beside our record. The heal restored our 2: the operator's 4 was
    lost. What was there last comes back."""
    w = World()
    await w.settle()
    await w.outage()
    w.scale(MCM, 4)
    w.annotate(MCM, {REPLICAS: "4"})  # dependency-watchdog's scale-down: the count it takes ...
    w.scale(MCM, 0)  # ... then the scale
    w.alive |= set(w.names)
    await w.until(lambda: w.replicas() == {**CONTROLLERS, MCM: 4} and not w.annotations(MCM), 80, "restored")


async def test_an_operators_lower_count_during_the_restore_is_kept() -> None:
    w = World()
    await w.settle()
    await w.outage()
    w.seed.controller = False  # KCM does not become ready at once
    w.alive |= set(w.names)
    await w.until(lambda: w.replicas()[KCM] == 3, 40, "KCM scaled up")
    w.scale(KCM, 1)  # the operator lowers it while its restore is pending
    w.seed.controller = True
    w.seed.follow(deployment_path(KCM))
    mark = len(w.trace)
    await w.run(60)
    assert all(r[KCM] == 1 for _, r in w.trace[mark:]), [r[KCM] for _, r in w.trace[mark:]]
    assert w.annotations(KCM) == {} and ours(w, KCM) is None


async def test_dependency_watchdogs_scale_up_during_our_outage_is_lowered_and_reported_once() -> None:
    w = World()
    await w.settle()
    await w.outage()
    mark = len(w.seed.writes)
    for round_ in range(2):  # DWD's kubelet-lease probe still passes, twice
        for name in CONTROLLERS:
            w.dwd_scale_up(name)
        await w.run(12)
        assert w.replicas() == DOWN, f"round {round_}: {w.replicas()}"
    raised = [e for e in events(w, mark) if "by someone else" in e]
    assert len(raised) == len(CONTROLLERS), raised  # once per dependent and episode
    assert {n: (ours(w, n) or {}).get("replicas") for n in CONTROLLERS} == CONTROLLERS
    assert all(w.annotations(n)[MELTDOWN] == "" for n in CONTROLLERS)  # put back for gardenlet
    assert w.target.metrics.overridden.get(target="shoot", resource=KCM) == 2


async def test_after_a_raise_kcm_waits_again_for_mcm_to_stop() -> None:
    """Held down for longer than MCM's timeout, then raised by someone else: lowering it again,
    KCM (level 1) must wait for MCM to be seen stopped again, not count the old timeout."""
    w = World()
    await w.settle()
    await w.outage()
    await w.run(40)  # longer than the dependents' 30 s timeout
    for name in CONTROLLERS:
        w.dwd_scale_up(name)
    w.seed.controller = False  # MCM's pods take their time to go
    await w.until(lambda: w.replicas()[MCM] == 0, 15, "MCM lowered again")
    await w.run(20)
    assert w.replicas()[KCM] == 3, "KCM lowered while MCM still runs"
    w.seed.follow(deployment_path(MCM))
    w.seed.follow(deployment_path(CA))
    await w.until(lambda: w.replicas()[KCM] == 0, 15, "KCM lowered once MCM stopped")


# -- 8: a removed target's restore is the leader's job, and touches only what is ours


class Targets(Polled):
    """A source that names whatever the test says."""

    def __init__(self, *specs: TargetSpec) -> None:
        self.specs = {s.name: s for s in specs}

    async def desired(self) -> dict[str, TargetSpec]:
        return dict(self.specs)


def quick(w: World) -> tuple[Dependent, ...]:
    """The dependents without their scale-up delays: a fleet restores on the real clock."""
    return tuple(replace(d, scale_up=replace(d.scale_up, initial_delay_s=0.0)) for d in w.dependents)


def quick_fleet(w: World, *, leader: bool = True, metrics: AggregatorMetrics | None = None) -> Fleet:
    settings = with_settings(w.settings, recovery_period_s=0.05, poll_s=0.02, sweep_s=0.05, mode="file")
    leadership = Alone() if leader else Standby()
    return Fleet(Shared(settings, w.seed, quick(w), metrics or AggregatorMetrics()), leadership=leadership)


class Standby:
    """A replica that leads nothing."""

    def leading(self) -> bool:
        return False

    def scope(self, namespace: str) -> Scope:
        return Scope(lambda: False, lambda: -math.inf)


async def until_real(predicate: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_a_restart_after_a_target_was_removed_still_restores_what_it_scaled_down() -> None:
    w = World()
    await w.settle()
    await w.outage()
    # The target was removed (its Cluster hibernated, its entry gone) and the aggregator
    # restarted before anything restored it: the new process has never run that target.
    fleet = quick_fleet(w)
    task = asyncio.create_task(fleet.run(Targets()))
    try:
        assert await until_real(w.restored), w.replicas()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class OneShard:
    """Shards as a replica sees them: it holds some, and acts for those namespaces only."""

    def __init__(self, *held: str) -> None:
        self.namespaces = set(held)

    def leading(self) -> bool:
        return bool(self.namespaces)

    def scope(self, namespace: str) -> Scope:
        # A term without end: what is tested is which namespaces are swept.
        return Scope(lambda: namespace in self.namespaces)


@pytest.mark.parametrize("held", [True, False])
async def test_sharded_a_removed_targets_records_are_restored_by_its_shards_holder_alone(held: bool) -> None:
    """Sharded, the replica that would act for a target is the one that sweeps its namespace:
    another replica, whose source may see the target gone first, leaves it alone."""
    w = World()
    await w.settle()
    await w.outage()
    settings = with_settings(w.settings, recovery_period_s=0.05, poll_s=0.02, sweep_s=0.05, mode="file")
    shards = OneShard(NS, "shoot--p--other") if held else OneShard("shoot--p--other")
    fleet = Fleet(Shared(settings, w.seed, quick(w), AggregatorMetrics()), leadership=shards)
    task = asyncio.create_task(fleet.run(Targets()))
    try:
        assert await until_real(w.restored, 2.0) is held, w.replicas()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    if not held:
        assert w.replicas() == DOWN


async def test_an_aggregator_of_one_target_from_the_environment_sweeps_nothing() -> None:
    w = World()
    await w.settle()
    await w.outage()  # as if another aggregator of this seed held this shoot down
    fleet = quick_fleet(w)
    fleet.settings = with_settings(fleet.settings, mode="env")
    fleet.orphans.settings = fleet.settings
    task = asyncio.create_task(
        fleet.run(Targets(TargetSpec("other", "shoot--p--other", kubeconfig_path="-")))
    )
    try:
        await asyncio.sleep(0.5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert w.replicas() == DOWN


async def test_a_removed_target_touches_only_what_carries_our_record() -> None:
    w = World()
    await w.settle()
    w.dwd_scale_down(KCM)  # a hibernated shoot's KCM at 0, with DWD's marks on it
    spec = TargetSpec("shoot", NS, kubeconfig_path="-")
    fleet = quick_fleet(w)
    fleet.running["shoot"] = Running(spec)
    fleet.tasks["shoot"] = asyncio.create_task(asyncio.sleep(3600))
    task = asyncio.create_task(fleet.run(Targets()))
    try:
        await asyncio.sleep(0.5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert w.replicas()[KCM] == 0
    assert w.annotations(KCM) == {REPLICAS: "3", MELTDOWN: ""}
    assert not [x for x in seed_writes(w, name=KCM) if x[0] == "PATCH"]


async def test_a_standby_runs_nothing_for_removed_targets_and_their_series_leave_the_metrics() -> None:
    w = World()
    metrics = AggregatorMetrics()
    fleet = quick_fleet(w, leader=False, metrics=metrics)
    before = len(asyncio.all_tasks())
    for i in range(100):
        name = f"shoot--p--gone-{i}"
        metrics.scale_actions.inc(target=name, resource=KCM, direction="down", result="scaled")
        metrics.blocked.inc(target=name, reason="watch_stale")
        metrics.target_errors.inc(target=name)
        fleet.running[name] = Running(TargetSpec(name, name, kubeconfig_path="-"))
        fleet.tasks[name] = asyncio.create_task(asyncio.sleep(3600))
        fleet._reconcile({})
    await asyncio.sleep(0.05)
    assert len(asyncio.all_tasks()) <= before, [t.get_name() for t in asyncio.all_tasks()]
    assert "gone-" not in metrics.registry.render()


# -- 9: a missing dependent that is not optional is an error


async def test_a_missing_required_dependent_is_an_error_not_convergence() -> None:
    typo = Dependent(
        "apps/v1", "Deployment", "machine-controler-manager", False, Step(1, 0.0, 30.0), Step(0, 0.0, 30.0)
    )
    w = World(dependents=(*DEFAULT_DEPENDENTS, typo))
    await w.settle()
    await w.outage()
    await w.run(3)
    assert not w.target.scaler.converged
    status = w.target.snapshot()["dependents"]["machine-controler-manager"]
    assert "does not exist" in status["error"]
    assert [e for e in events(w) if "machine-controler-manager" in e and "does not exist" in e]
    assert w.target.metrics.missing.get(target="shoot", resource="machine-controler-manager") == 1


# -- 10: leadership has its own connection


async def test_the_leader_renews_and_the_seed_is_watched_at_once_while_the_targets_pool_is_saturated() -> (
    None
):
    from aggregator.__main__ import SeedClients
    from aggregator.kube.endpoint import Endpoint
    from aggregator.lead.leader import LeaderElector
    from aggregator.model.settings import LeaderSettings

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(2.0)  # a seed at its limit during a seed-wide incident
        return web.json_response({})

    async def no_lease(_: web.Request) -> web.Response:
        return web.json_response({"reason": "NotFound", "code": 404}, status=404)

    async def created(_: web.Request) -> web.Response:
        return web.json_response({"metadata": {"name": "dwd-lease-aggregator"}}, status=201)

    async def clusters(_: web.Request) -> web.Response:
        return web.json_response({"kind": "ClusterList", "metadata": {"resourceVersion": "1"}, "items": []})

    app = web.Application()
    leases = "/apis/coordination.k8s.io/v1/namespaces/garden/leases"
    app.add_routes(
        [
            web.patch("/slow", slow),
            web.get(leases + "/dwd-lease-aggregator", no_lease),
            web.post(leases, created),
            web.get(leases, clusters),  # no shard Leases (aggregator/lead/leader.py asks before taking)
            web.get("/apis/extensions.gardener.cloud/v1alpha1/clusters", clusters),
        ]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    import ssl

    endpoint = Endpoint(f"http://127.0.0.1:{port}", ssl.create_default_context(), lambda: None, "test")
    clients = SeedClients.of(lambda: endpoint)
    seed, election, watches = clients.targets, clients.election, clients.watches
    burst = [asyncio.create_task(seed.merge_patch("/slow", {})) for _ in range(seed.connections + 24)]
    burst += [asyncio.create_task(clients.events.merge_patch("/slow", {})) for _ in range(24)]
    try:
        await asyncio.sleep(0.2)  # every connection of the seed's pool is busy
        elector = LeaderElector(election, LeaderSettings(enabled=True))
        started = time.monotonic()
        await elector._try_once()
        took = time.monotonic() - started
        assert elector.is_leader()
        assert took < 1.0, f"the renewal waited {took:.1f}s behind the scale writes"
        started = time.monotonic()
        await watches.get("/apis/extensions.gardener.cloud/v1alpha1/clusters")
        took = time.monotonic() - started
        assert took < 1.0, f"the Clusters' LIST waited {took:.1f}s behind the scale writes"
        started = time.monotonic()
        await seed.get("/apis/extensions.gardener.cloud/v1alpha1/clusters")
        took = time.monotonic() - started
        assert took >= 1.0, "the targets' pool was not saturated: the test proves nothing"
    finally:
        for t in burst:
            t.cancel()
        await asyncio.gather(*burst, return_exceptions=True)
        await clients.close()
        await runner.cleanup()


# -- 11: provisioning writes are bounded by the term


async def test_provisioning_stops_writing_when_the_term_ends() -> None:
    w = World(50)
    for name in w.names:
        del w.shoot.objects[node_lease_path(DEFAULT_LEASE_NAMESPACE, name)]
    t = w.target
    for informer in (t.parts.nodes, t.parts.leases):
        await informer.list_now()
    creates = 0

    def count(method: str, path: str) -> None:
        nonlocal creates
        if method == "POST" and path.endswith("/leases"):
            creates += 1
            if creates == 10:
                w.term_end = w.clock()  # the leader's term ends in the middle of the pass

    w.shoot.on_request = count
    await t.parts.provisioner.reconcile(t.parts.pacer.plan)
    assert creates == 10, f"{creates - 10} lease writes after the term ended"
