"""Safe in every interleaving: one test per hole the review of the decision path found (issue
"Safe in every interleaving"), each seen failing on the code before its fix.

The Target tick by tick in the fake world of tests/unit/world.py at the defaults
(aggregator/model/settings.py; MCM 30 s after KCM), or the Fleet in real time
with short settings where the hole is in a loop the world does not drive. The stateful model
(tests/model/) hunts the next ones; what it found is kept in tests/model/test_found.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest

from aggregator.act.orphans import Orphans
from aggregator.fleet import Fleet
from aggregator.lead.leader import LeaderElector
from aggregator.lead.scope import Scope
from aggregator.lead.shards import Shards
from aggregator.model.dependents import Dependent, Step
from aggregator.model.records import MELTDOWN, RECORD, REPLICAS, Record, record_marks
from aggregator.model.settings import LeaderSettings
from aggregator.model.verdict import Phase
from aggregator.observe.replicas import DependentState
from aggregator.observe.sources import CLUSTERS, GardenerSource
from aggregator.ops.metrics import AggregatorMetrics
from aggregator.shoot import Shared
from aggregator.target import Target
from core.errors import KubeError, TransportError, api_error
from testenv.gardener.seed_objects import cluster
from testenv.kube.controllers import CA, CONTROLLERS, DOWN, KCM, MCM
from tests.unit.fakekube import FakeKube
from tests.unit.world import NS, Clock, World, deployment_path, with_settings

# -- 1: the second witness has a blind second


def kubelets_at(w: World, offset_s: float) -> None:
    """Every kubelet's next renewal ``offset_s`` from now, then every 10 s."""
    for name in w.names:
        w.kubelet_due[name] = w.clock() + offset_s


@pytest.mark.parametrize("phase_s", range(10))
async def test_agents_failing_while_the_kubelets_renew_scale_nothing_at_any_kubelet_phase(
    phase_s: int,
) -> None:
    """Two nodes (the least that is judged), every agent answered 403 from one moment on, both
    kubelets at the same phase: at some phases they renewed within the margin after the agents'
    last renewal and next only after the scale-down's read."""
    w = World(nodes=2)
    await w.settle()
    w.agents_failing = set(w.names)
    kubelets_at(w, phase_s)
    await w.run(60)
    assert not w.ever_scaled_down(), (phase_s, w.target.status.reason)


@pytest.mark.parametrize("failure_s", range(10))
async def test_at_the_shortest_lease_agents_failing_scale_nothing_whatever_the_moment(failure_s: int) -> None:
    """``DWD_LEASE_DURATION=4s`` (twice the interval): the check could see 5 s of the kubelets'
    10; ten nodes with their kubelets spread over those 10 s, the agents failing at each second."""
    w = World(lease_duration_s=4.0)
    await w.settle()
    await w.run(failure_s)
    w.agents_failing = set(w.names)
    await w.run(60)
    assert not w.ever_scaled_down(), (failure_s, w.target.status.reason)


@pytest.mark.parametrize("phase_s", [0, 2.5, 5, 9])
async def test_a_real_cut_is_still_scaled_down_before_kcm_acts_at_any_kubelet_phase(phase_s: float) -> None:
    w = World()
    await w.settle()
    kubelets_at(w, phase_s)
    w.alive.clear()
    took = await w.until(lambda: w.replicas() == DOWN, 40, "every controller scaled down")
    # The agents' last renewals, a whole kubelet interval and the margin after them, the read:
    # well inside KCM's 40 s grace.
    assert took <= 18, took


async def test_a_scale_down_waiting_for_the_kubelets_looks_right_after_they_are_due() -> None:
    """The second witness costs a real cut no tick: a verdict that waits for pending kubelets
    says when the first is due, and the next look is right after it, not a whole tick later."""
    w = World()
    await w.settle()
    kubelets_at(w, 0.5)  # each kubelet renews just after its agent: pending once the agents stop
    w.alive.clear()
    wakes = []
    for _ in range(int(20 / w.target.params.tick_s)):
        await w.run(w.target.params.tick_s)
        if w.target.wake_at is not None:
            wakes.append(w.target.wake_at)
    assert wakes, "no verdict waited for a kubelet's renewal"
    t, now = w.target, w.clock()
    t.wake_at = now + 0.3
    assert t.next_tick_in(now) == pytest.approx(0.35)
    t.wake_at = now + 5
    assert t.next_tick_in(now) == t.params.tick_s
    t.wake_at = None
    assert t.next_tick_in(now) == t.params.tick_s


# -- 2: a target that never lists never restores


def quick_dependents() -> list[Dependent]:
    """The three controllers without initial delays, so a restore takes ticks, not 30 s."""
    return [
        Dependent("apps/v1", "Deployment", KCM, False, Step(1, 0.0, 5.0), Step(0, 0.0, 5.0)),
        Dependent("apps/v1", "Deployment", MCM, False, Step(0, 0.0, 5.0), Step(1, 0.0, 5.0)),
        Dependent("apps/v1", "Deployment", CA, True, Step(0, 0.0, 5.0), Step(1, 0.0, 5.0)),
    ]


def held_down(seed: FakeKube, namespace: str = NS) -> None:
    """The three controllers at 0, carrying our record: what a scale-down of ours left."""
    for name, replicas in CONTROLLERS.items():
        seed.put(
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
            {
                "metadata": {
                    "annotations": record_marks(Record(replicas, namespace, "2026-12-02T12:00:00Z")),
                    "labels": {RECORD: "true"},
                },
                "spec": {"replicas": 0},
                "status": {"replicas": 0, "readyReplicas": 0},
            },
        )


def at(seed: FakeKube, name: str, namespace: str = NS) -> int:
    return int(seed.objects[f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["spec"]["replicas"])


SHORT = {
    "lease_duration_s": 1.0,
    "fast_interval_s": 0.5,
    "blind_limit_s": 1.0,
    "confirm_period_s": 0.2,
    "recovery_period_s": 0.2,
}


async def until_real(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_a_started_target_whose_shoot_refuses_it_restores_after_the_blind_limit() -> None:
    """A restart (or a replica that never listed the shoot taking over) finds our records, and the
    shoot's API server refuses the aggregator (a revoked token): nothing is ever listed."""
    w = World()
    settings = with_settings(w.settings, **SHORT)
    shoot, seed = FakeKube(), FakeKube()
    shoot.fail(error=lambda: api_error(401, '{"reason":"Unauthorized","message":"token revoked"}'))
    held_down(seed)
    target = Target("shoot", NS, shoot, Shared(settings, seed, quick_dependents()), scope=Scope())
    task = asyncio.create_task(target.run())
    try:
        restored = await until_real(lambda: {n: at(seed, n) for n in CONTROLLERS} == CONTROLLERS, 6.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert restored, ({n: at(seed, n) for n in CONTROLLERS}, target.status.reason)


def gardener_fleet(seed: FakeKube, **changes: Any) -> tuple[Fleet, GardenerSource]:
    w = World()
    settings = with_settings(
        w.settings, **(SHORT | {"poll_s": 0.05, "sweep_s": 0.1, "mode": "gardener"} | changes)
    )
    fleet = Fleet(Shared(settings, seed, quick_dependents(), AggregatorMetrics()))
    return fleet, GardenerSource(seed, "shoot-access", settings.watching)


async def run_fleet(fleet: Fleet, source: GardenerSource, predicate: Any, timeout_s: float) -> bool:
    task = asyncio.create_task(fleet.run(source))
    try:
        return await until_real(predicate, timeout_s)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_target_whose_kubeconfig_is_unusable_restores_after_the_blind_limit() -> None:
    """The fleet's version: the shoot-access Secret is missing, so the target never gets a client;
    its namespace still counted as served and the sweep left its records alone too."""
    seed = FakeKube()
    seed.put(f"{CLUSTERS}/{NS}", cluster(NS))
    held_down(seed)
    fleet, source = gardener_fleet(seed)
    restored = await run_fleet(
        fleet, source, lambda: {n: at(seed, n) for n in CONTROLLERS} == CONTROLLERS, 6.0
    )
    assert restored, ({n: at(seed, n) for n in CONTROLLERS}, fleet.snapshot())


# -- 3: a write in flight across a hand-over lands after it


async def test_a_scale_down_that_lands_after_a_hand_over_is_restored_by_the_new_leader() -> None:
    """Replica A's scale-down of MCM and CA is held by a slow seed while A's term ends; B takes
    over on a healed shoot, converges to running, and then A's write lands."""
    w = World()
    leader = {"a": True, "b": False}
    w.new_target(is_leader=lambda: leader["a"])
    b = w.new_target(is_leader=lambda: leader["b"], replace_first=False)
    b.scaler.replicas.watched = lambda d: current(w, d.name)  # B's seed watch: current, never behind
    await w.settle()
    w.alive -= set(w.names[:7])
    await w.until(lambda: w.target.memory.phase is Phase.CONFIRMING, 20, "confirming")
    w.seed.hold("PATCH", f"/deployments/({MCM}|{CA})")
    await w.until(lambda: len(w.seed.pending) == 2, 10, "A's scale-down sent")
    leader["a"], leader["b"] = False, True  # A's term ended; B holds the Lease
    w.alive = set(w.names)  # the path healed meanwhile
    await w.run(20)
    assert b.memory.phase is Phase.HEALTHY and w.replicas() == CONTROLLERS
    assert w.seed.land() == [None, None]  # A's writes land now: MCM and CA at 0, with our record
    assert w.replicas()[MCM] == 0
    took = await w.until(w.restored, 45, "B restores what A's late write lowered")
    assert took <= 15, took


def current(w: World, name: str) -> DependentState:
    """A seed watch that is never behind."""
    return DependentState.from_object(name, w.seed.objects[deployment_path(name)])


async def test_a_new_leader_whose_watch_is_behind_the_old_leaders_record_still_restores() -> None:
    """The old leader's last scale-down is in the seed, but the new leader's watch of the
    dependents has not delivered it yet when it starts: it must not take 'nothing recorded'
    for the truth and stop looking once the path heals."""
    w = World()
    await w.settle()
    await w.outage()
    w.alive = set(w.names)  # the path heals as the leadership moves
    behind = {}
    for name, replicas in CONTROLLERS.items():
        obj = json.loads(json.dumps(w.seed.objects[deployment_path(name)]))
        obj["metadata"]["annotations"], obj["spec"]["replicas"] = {}, replicas
        behind[name] = DependentState.from_object(name, obj)
    target = w.new_target()
    watch = {"behind": True}
    target.scaler.replicas.watched = lambda d: behind[d.name] if watch["behind"] else current(w, d.name)
    await w.run(20)
    watch["behind"] = False  # the watch delivers what the seed has had all along
    took = await w.until(w.restored, 60, "every controller back")
    assert took <= 45, took


LEADER = "/apis/coordination.k8s.io/v1/namespaces/garden/leases/dwd-lease-aggregator"


async def a_held_write(scope: Scope, seed: FakeKube, path: str) -> None:
    """A write of this term that the seed takes in and does not answer: it may land later."""
    seed.hold("PATCH", path)
    with contextlib.suppress(KubeError), scope.writes.write(path):
        await seed.merge_patch(path, {"spec": {"replicas": 0}})


async def test_a_clean_shutdown_leaves_the_leader_lease_to_expire_while_a_write_may_still_land() -> None:
    seed, clock = FakeKube(), Clock()
    a = LeaderElector(seed, LeaderSettings(True, "garden"), identity="a", clock=clock)
    b = LeaderElector(seed, LeaderSettings(True, "garden"), identity="b", clock=clock)
    await a._try_once()
    await b._try_once()
    await a_held_write(a.scope(NS), seed, deployment_path(MCM))
    await a.release()
    assert seed.objects[LEADER]["spec"]["holderIdentity"] == "a"  # not handed on while it may land
    assert not a.is_leader()  # but a stopped acting at once
    clock.now += 14.9
    await b._try_once()
    assert not b.is_leader()
    clock.now += 0.1
    await b._try_once()
    assert b.is_leader()  # a lease duration after a's last renewal, as if a had died


async def test_a_clean_shutdown_hands_the_leader_lease_on_at_once_when_every_write_was_answered() -> None:
    seed, clock = FakeKube(), Clock()
    a = LeaderElector(seed, LeaderSettings(True, "garden"), identity="a", clock=clock)
    await a._try_once()
    seed.put(deployment_path(MCM), {"spec": {"replicas": 2}})
    with a.scope(NS).writes.write(deployment_path(MCM)):
        await seed.merge_patch(deployment_path(MCM), {"spec": {"replicas": 0}})
    with contextlib.suppress(KubeError), a.scope(NS).writes.write(deployment_path(KCM)):
        await seed.merge_patch(deployment_path(KCM), {"spec": {"replicas": 0}})  # 404: answered
    await a.release()
    assert seed.objects[LEADER]["spec"]["holderIdentity"] == ""


async def test_a_shard_with_a_write_that_may_still_land_is_not_given_back_but_left_to_expire() -> None:
    seed, clock = FakeKube(), Clock()
    a = Shards(seed, LeaderSettings(True, "garden", shards=1), 1, identity="a", clock=clock)
    for _ in range(10):
        clock.now += 2.0
        await a.step()
    assert a.held() == [0]
    await a_held_write(a.scope(NS), seed, deployment_path(MCM))
    await a.release()
    shard = "/apis/coordination.k8s.io/v1/namespaces/garden/leases/dwd-lease-aggregator-shard-0"
    assert seed.objects[shard]["spec"]["holderIdentity"] == "a" and a.held() == []


# -- 4: a lost record strands


async def test_our_record_removed_by_another_writer_while_held_down_is_still_restored() -> None:
    w = World()
    await w.settle()
    await w.outage()
    w.annotate(KCM, {RECORD: None})  # another writer removes our annotation
    await w.run(12)
    w.alive = set(w.names)
    took = await w.until(lambda: w.replicas() == CONTROLLERS, 60, "every controller back")
    assert took <= 45, took


async def test_annotations_wiped_while_held_down_restore_the_count_this_process_lowered() -> None:
    """A re-apply of KCM's manifest wipes every annotation (ours and dependency-watchdog's count
    beside it) while it is held at 0; our label stays. The count comes from what this process
    lowered, not from the fallback of 1."""
    w = World()
    await w.settle()
    await w.outage()
    w.annotate(KCM, {RECORD: None, REPLICAS: None, MELTDOWN: None})
    await w.run(1)
    w.alive = set(w.names)
    await w.until(lambda: w.replicas() == CONTROLLERS, 60, "every controller back at its count")


async def test_a_dropped_label_or_annotation_is_written_back_while_held_down() -> None:
    """The record survives this process only in the seed: what another writer removed is written
    back at the next look (every ``reverify_s`` while held down)."""
    w = World()
    await w.settle()
    await w.outage()
    w.seed.objects[deployment_path(MCM)]["metadata"]["labels"].pop(RECORD)
    w.annotate(CA, {RECORD: None})
    await w.run(12)
    for name in (MCM, CA):
        meta = w.seed.objects[deployment_path(name)]["metadata"]
        assert meta["labels"].get(RECORD) == str(CONTROLLERS[name]) and RECORD in meta["annotations"], meta
    assert w.replicas() == DOWN


async def test_a_record_whose_label_was_dropped_is_swept_once_its_target_is_gone() -> None:
    w = World()
    await w.settle()
    await w.outage()
    for name in CONTROLLERS:
        w.seed.objects[deployment_path(name)]["metadata"]["labels"].pop(RECORD)
    settings = with_settings(w.settings, mode="file")
    orphans = Orphans(
        w.seed,
        quick_dependents(),
        settings,
        AggregatorMetrics(),
        served=set,
        clock=w.clock,
    )
    for _ in range(40):
        w.clock.now += 1
        await orphans.sweep()
    assert w.replicas() == CONTROLLERS


@pytest.mark.parametrize("mode", ["file", "env"])
async def test_a_dependent_dropped_from_the_settings_while_held_down_is_restored(mode: str) -> None:
    """A rollout removes cluster-autoscaler from the dependents while the shoot is held down:
    the target that still serves the namespace acts on KCM and MCM only, so the sweep restores
    the dropped one (before, it stayed at 0 with our record for good)."""
    w = World()
    await w.settle()
    await w.outage()
    assert w.replicas() == DOWN
    settings = with_settings(w.settings, mode=mode)
    kept = [d for d in quick_dependents() if d.name != CA]
    orphans = Orphans(w.seed, kept, settings, AggregatorMetrics(), served=lambda: {NS}, clock=w.clock)
    for _ in range(40):
        w.clock.now += 1
        await orphans.sweep()
    assert w.replicas() == {**DOWN, CA: CONTROLLERS[CA]}
    assert not {RECORD, MELTDOWN} & set(
        w.seed.objects[deployment_path(CA)]["metadata"].get("annotations") or {}
    )


@pytest.mark.parametrize("mode", ["file", "env"])
async def test_a_dropped_dependent_whose_label_goes_after_the_sweep_found_it_is_still_restored(
    mode: str,
) -> None:
    """As above, and another writer removes our label from the dropped one once the sweep has
    found it: a list by label no longer shows it, and no target writes the label back (it is
    configured nowhere). The model's soak found it at 0 with our annotation for good; what the
    sweep has found it asks for by name until it is restored or carries no mark of ours."""
    w = World()
    await w.settle()
    await w.outage()
    settings = with_settings(w.settings, mode=mode)
    kept = [d for d in quick_dependents() if d.name != CA]
    orphans = Orphans(w.seed, kept, settings, AggregatorMetrics(), served=lambda: {NS}, clock=w.clock)
    await orphans.sweep()
    assert CA in orphans.orphaned.get(NS, {}), orphans.orphaned
    w.seed.objects[deployment_path(CA)]["metadata"]["labels"].pop(RECORD)
    for _ in range(40):
        orphans.wake.set()  # listed again at every pass (a target dropped, a new term)
        w.clock.now += 1
        await orphans.sweep()
    assert w.replicas() == {**DOWN, CA: CONTROLLERS[CA]}
    assert RECORD not in (w.seed.objects[deployment_path(CA)]["metadata"].get("annotations") or {})


# -- 5: the sweep raises a hibernated shoot


async def test_a_shoot_hibernated_while_held_down_is_not_raised_and_handed_back() -> None:
    """gardenlet hibernates a shoot we hold down: it wants the controllers at 0. The sweep must
    not raise them, and must not leave our marks (Gardener does not scale up what carries
    meltdown-protection-active) for its wake-up."""
    seed = FakeKube()
    seed.put(f"{CLUSTERS}/{NS}", cluster(NS, hibernation=True))
    held_down(seed)
    fleet, source = gardener_fleet(seed)

    def handed_back() -> bool:
        objs = [seed.objects[deployment_path(n)]["metadata"].get("annotations") or {} for n in CONTROLLERS]
        return not any(k in a for a in objs for k in (RECORD, REPLICAS, MELTDOWN))

    done = await run_fleet(fleet, source, handed_back, 3.0)
    assert {n: at(seed, n) for n in CONTROLLERS} == DOWN
    assert done, [seed.objects[deployment_path(n)]["metadata"] for n in CONTROLLERS]


# -- 6: the aggregator's own overload reads as the shoot's


async def test_a_probe_that_timed_out_while_our_own_loop_was_late_does_not_restart_judging() -> None:
    """A seed-wide cut: the event loop lags 1.8 s while every target's interlocks run, and this
    target's probe times out. That says nothing about the shoot: the scale-down comes at the
    next tick that can check, not a lease duration and a confirm period later."""
    w = World()
    await w.settle()
    w.alive.clear()
    await w.until(lambda: w.target.memory.phase is Phase.CONFIRMING, 20, "confirming")
    late = {"lag": 0.0}

    def overloaded(method: str, path: str) -> None:
        if path == "/readyz" and late["lag"] == 0.0:
            late["lag"] = 1.8  # our loop ran 1.8 s late while this probe waited
            w.loop_lag.record(w.clock(), 1.8)
            raise TransportError("timeout", "probe: no answer within 3s")

    w.shoot.on_request = overloaded
    start = w.clock()
    took = await w.until(lambda: w.replicas() == DOWN, 30, "every controller scaled down")
    assert late["lag"] == 1.8, "the probe was asked"
    # The confirm period, then the tick the checks could not run, then the next: not another
    # lease duration and confirm period (17 s before).
    assert took <= 4 + 1 + 1, (took, start)
    assert w.target.metrics.blocked.get(target="shoot", reason="self_overloaded") == 1
