"""Safe in a seed that others write too, against real shoot and seed API servers.

The aggregator runs as its own process (FAST_ENV: the default rules on a shorter clock);
dependency-watchdog is testenv/gardener/prober_standin.py, which writes the Deployments exactly as the v1.7.0
prober does, judging kubelet leases that ``NodeLeaseDriver`` renews. A "cut" silences both the
kubelets and the agents of seven of ten nodes, as a broken path does. Everything is judged by
what lands in the seed, sampled every 100 ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from aggregator.model.records import MELTDOWN, RECORD, REPLICAS
from testenv.base.wait import eventually, wait_for
from testenv.kube.controllers import CONTROLLERS, DOWN, KCM, MCM
from testenv.kube.controlplane import ensure_namespace
from testenv.kube.standins import DEPLOYMENTS, deployment
from testenv.worlds.shoot_world import FAST_DEPENDENTS, Sample, Shoot
from tests.integration.dwdworld import NODES, DwdWorld

pytestmark = pytest.mark.integration

SEVEN = set(NODES[:7])


def marks(shoot: Shoot) -> dict[str, dict[str, str]]:
    """The record keys (ours and dependency-watchdog's) on each controller."""
    keys = (RECORD, REPLICAS, MELTDOWN)
    return {
        name: {k: v for k, v in (d["metadata"].get("annotations") or {}).items() if k in keys}
        for name, d in shoot.deployments().items()
    }


def restored(shoot: Shoot) -> bool:
    return shoot.replicas() == CONTROLLERS and not any(marks(shoot).values())


def lowered(s: Sample) -> bool:
    return any(s.replicas[n] < r for n, r in CONTROLLERS.items())


def our_events(shoot: Shoot) -> list[dict[str, object]]:
    return [e for e in shoot.events() if (e.get("source") or {}).get("component") == "dwd-lease-aggregator"]


def dwd_protects(w: DwdWorld) -> None:
    """Seven kubelets fall silent and dependency-watchdog scales the shoot down."""
    w.cut(SEVEN)
    wait_for(lambda: w.dwd.verdict().action == "scale-down", 10, "seven kubelet leases expired", every_s=0.1)
    assert w.dwd.probe_once() == "scale-down"
    assert w.shoot.replicas() == DOWN


def judging(shoot: Shoot, **env: str) -> None:
    shoot.start_aggregator(env)
    shoot.wait_leases_renewed()
    time.sleep(3)  # past one lease duration of fresh view


@pytest.mark.timeout(180)
def test_a_shoot_dependency_watchdog_healed_is_taken_over_and_rolled_without_lowering_anything(
    world_for: Callable[..., DwdWorld],
) -> None:
    """The migration: dependency-watchdog protects the shoot through an outage and heals it,
    leaving its ``replicas`` on all three; its prober is switched off; two aggregator replicas
    start and the leader is killed (a rolling update's takeover). Nothing may be lowered."""
    w = world_for()
    shoot = w.shoot
    dwd_protects(w)
    w.heal()
    wait_for(lambda: w.dwd.verdict().action == "scale-up", 10, "the kubelets renewing again", every_s=0.1)
    assert w.dwd.probe_once() == "scale-up"
    leftover = {n: {REPLICAS: str(r)} for n, r in CONTROLLERS.items()}
    assert shoot.replicas() == CONTROLLERS and marks(shoot) == leftover  # DWD's leftover, for ever

    sampler = shoot.sampler()
    election = shoot.election_env()
    first = shoot.start_aggregator(election)
    leader = wait_for(shoot.election_holder, 30, "the first replica to lead")
    shoot.start_aggregator(election)
    shoot.wait_leases_renewed()
    time.sleep(6)  # judging for a while, both replicas
    first.kill()
    wait_for(lambda: shoot.election_holder() not in ("", leader), 20, "the standby to take over", every_s=0.2)
    time.sleep(8)  # the new leader resumes, and judges for longer than confirm + recovery
    dip = sampler.first(lowered)
    assert dip is None, f"lowered on a healthy shoot: {dip}"
    assert marks(shoot) == leftover  # somebody else's, left as it is
    assert not our_events(shoot)


@pytest.mark.timeout(120)
def test_dry_run_beside_dependency_watchdogs_protection_writes_nothing(
    world_for: Callable[..., DwdWorld],
) -> None:
    """An aggregator in dry-run watches a shoot; the path breaks and dependency-watchdog holds
    the shoot down. Through all of it the aggregator must write nothing, neither a scale nor an
    annotation nor an Event, and still decide and say so."""
    w = world_for()
    shoot = w.shoot
    agg = shoot.start_aggregator({"DWD_DRY_RUN": "true"})
    shoot.wait_leases_renewed()
    time.sleep(3)  # judging
    dwd_protects(w)
    held = marks(shoot)
    sampler = shoot.sampler()
    time.sleep(12)  # the outage goes on: six lease durations, many recovery periods
    changed = sampler.first(lambda s: s.replicas != DOWN)
    assert changed is None, f"dry-run changed the replicas: {changed}"
    assert marks(shoot) == held
    assert not our_events(shoot)
    phases = [e.get("phase") for e in agg.events() if e["event"] == "target_phase"]
    assert "scaled-down" in phases, phases  # it decided, and said so


def slow_mcm(shoot: Shoot, delay: str) -> Path:
    """The fast dependents, with MCM coming back ``delay`` after KCM (the scale-up window)."""
    deps = yaml.safe_load(yaml.safe_dump(FAST_DEPENDENTS))
    for d in deps["dependentResourceInfos"]:
        if d["ref"]["name"] == MCM:
            d["scaleUp"]["initialDelay"] = delay
    path = shoot.tmp / "dependents-slow-mcm.yaml"
    path.write_text(yaml.safe_dump(deps))
    return path


@pytest.mark.timeout(180)
def test_a_takeover_in_the_scale_up_window_lowers_nothing(shoot: Shoot) -> None:
    """KCM is back and MCM waits its delay, its record still on it: the leader is killed and the
    standby takes over right there. KCM must not be lowered again."""
    shoot.setup()
    env = {**shoot.election_env(), "DWD_DEPENDENTS_FILE": str(slow_mcm(shoot, "10s"))}
    first = shoot.start_aggregator(env)
    leader = wait_for(shoot.election_holder, 30, "the first replica to lead")
    shoot.start_aggregator(env)
    shoot.wait_leases_renewed()
    time.sleep(4)
    shoot.driver.alive -= SEVEN
    wait_for(lambda: shoot.replicas() == DOWN, 30, "every controller scaled down", every_s=0.1)
    sampler = shoot.sampler()
    shoot.driver.alive |= SEVEN
    wait_for(lambda: shoot.replicas()[KCM] == CONTROLLERS[KCM], 30, "KCM back", every_s=0.1)
    back = time.monotonic()
    assert shoot.replicas()[MCM] == 0  # in the window
    window_marks = marks(shoot)[MCM]
    first.kill()
    wait_for(lambda: shoot.election_holder() not in ("", leader), 20, "the standby to take over", every_s=0.2)
    wait_for(lambda: restored(shoot), 40, "the scale-up finished by the new leader", every_s=0.2)
    dip = sampler.first(lambda s: s.replicas[KCM] < CONTROLLERS[KCM], after=back)
    assert dip is None, f"KCM lowered again {dip.t - back:.1f}s after it came back" if dip else ""
    assert RECORD in window_marks  # MCM waited with our record on it


@pytest.mark.timeout(180)
def test_a_rollout_during_an_outage_raises_nothing(shoot: Shoot) -> None:
    """Held down through an outage, both replicas are replaced one after the other, the leader
    first (a rolling update): every new leader resumes held, confirms the outage and keeps the
    controllers at 0; nothing is raised until the path heals."""
    shoot.setup()
    env = shoot.election_env()
    first = shoot.start_aggregator(env)
    leader = wait_for(shoot.election_holder, 30, "the first replica to lead")
    second = shoot.start_aggregator(env)
    shoot.wait_leases_renewed()
    time.sleep(4)
    shoot.driver.alive -= SEVEN
    wait_for(lambda: shoot.replicas() == DOWN, 30, "every controller scaled down", every_s=0.1)
    sampler = shoot.sampler()
    held = time.monotonic()
    first.kill()
    shoot.start_aggregator(env)  # the new pod of the rollout
    wait_for(lambda: shoot.election_holder() not in ("", leader), 20, "the standby to take over", every_s=0.2)
    time.sleep(3)
    second.kill()
    shoot.start_aggregator(env)
    time.sleep(10)  # both replaced; the outage goes on
    raised = sampler.first(lambda s: s.replicas != DOWN, after=held)
    assert raised is None, f"raised {raised.t - held:.1f}s into the rollout: {raised}" if raised else ""
    shoot.driver.alive |= SEVEN
    wait_for(lambda: restored(shoot), 30, "restored once the path heals", every_s=0.2)


@pytest.mark.timeout(180)
def test_a_target_removed_while_down_is_restored_by_the_next_process_and_nothing_else(shoot: Shoot) -> None:
    """Two targets from a file: this shoot, and a hibernated one whose KCM dependency-watchdog
    left at 0. This shoot is scaled down; the aggregator is killed, both entries are removed, and
    a new process starts: it never ran either target. It must restore what carries our record,
    and only that."""
    shoot.setup()
    hibernated = shoot.namespace[:50] + "-hib"
    ensure_namespace(shoot.seed_admin, hibernated)
    held = deployment(KCM, 0)
    held["metadata"]["annotations"] = {REPLICAS: "3", MELTDOWN: ""}
    shoot.seed_admin.create(DEPLOYMENTS.format(ns=hibernated), held)
    targets = shoot.tmp / "targets.yaml"
    kubeconfig = str(shoot.shoot.kubeconfig)
    entries = [{"namespace": ns, "kubeconfig": kubeconfig} for ns in (shoot.namespace, hibernated)]
    targets.write_text(yaml.safe_dump({"targets": entries}))
    env = {"DWD_TARGETS": f"file:{targets}"}
    first = shoot.start_aggregator(env)
    shoot.wait_leases_renewed()
    time.sleep(3)
    shoot.driver.alive -= SEVEN
    wait_for(lambda: shoot.replicas() == DOWN, 30, "every controller scaled down", every_s=0.1)
    first.kill()
    targets.write_text(yaml.safe_dump({"targets": []}))
    shoot.driver.alive |= SEVEN
    started = time.monotonic()
    shoot.start_aggregator(env)
    ok = eventually(lambda: restored(shoot), 30)
    assert ok, f"{time.monotonic() - started:.0f}s after the restart: {shoot.replicas()}, {marks(shoot)}"
    other = shoot.seed_admin.get(f"{DEPLOYMENTS.format(ns=hibernated)}/{KCM}")
    assert other["spec"]["replicas"] == 0
    assert other["metadata"]["annotations"] == {REPLICAS: "3", MELTDOWN: ""}


@pytest.mark.timeout(180)
def test_dependency_watchdog_beside_the_aggregator_through_an_outage(
    world_for: Callable[..., DwdWorld],
) -> None:
    """Both run at once (what docs/install.md tells operators to avoid). dependency-watchdog
    judges a kubelet lease expired 6 s after its renewal and probes every 2 s: slower than the
    aggregator, as Gardener's 30 s against 12 s. Its scale-up raises what the aggregator lowered;
    the aggregator lowers it again and reports it. Nothing may be lost once the path heals."""
    w = world_for(kcm_grace_s=8.0, probe_interval_s=2.0)
    shoot = w.shoot
    w.dwd.start()
    judging(shoot)
    sampler = shoot.sampler()
    cut = time.monotonic()
    w.cut(SEVEN)
    wait_for(lambda: shoot.replicas() == DOWN, 20, "every controller scaled down", every_s=0.1)
    down = time.monotonic() - cut
    time.sleep(25)  # the outage goes on
    w.heal()
    wait_for(lambda: restored(shoot), 40, "everything restored, no mark left", every_s=0.2)
    outage = [s for s in sampler.samples if cut + down < s.t < cut + down + 25]
    dwd = [
        (x.name, x.body["spec"]["replicas"], round(x.t - cut, 1)) for x in w.dwd.writes if "spec" in x.body
    ]
    events = [str(e.get("message")) for e in our_events(shoot) if e.get("reason") == "RaisedWhileProtected"]
    # How long at a time a controller ran during the outage: DWD raises, then someone lowers.
    spells, start = [], None
    for s in outage:
        if s.replicas != DOWN and start is None:
            start = s.t
        elif s.replicas == DOWN and start is not None:
            spells.append(round(s.t - start, 1))
            start = None
    print(
        f"cut -> all at 0 {down:.1f}s; dependency-watchdog's scale writes (name, replicas, s after the cut):"
        f" {dwd}; a controller ran during the outage for {spells} s; our reports: {events}"
    )
    assert start is None, "a controller raised during the outage was still running at its end"
    # Each raise is undone within the re-check of a held-down shoot (10 s) and a tick.
    assert all(spell <= 12.0 for spell in spells), spells
