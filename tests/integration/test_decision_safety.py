"""Decisions that must stay safe when the shoot's KAPI, the seed or a leader misbehaves.

Every test drives the aggregator as its own process against real API servers
and judges it only by what lands in the seed: the controllers' spec.replicas
and dependency-watchdog's annotations. Seed faults come from a FaultProxy
between the aggregator and the seed API server.
"""

from __future__ import annotations

import time

import pytest

from testenv.base.wait import eventually, wait_for
from testenv.kube.controllers import CA, CONTROLLERS, DOWN, KCM, MCM
from testenv.net.faultproxy import FaultProxy
from testenv.worlds.shoot_world import Sample, Shoot

pytestmark = pytest.mark.integration

# Written as strings: the contract with the seed, whatever the code calls them. Ours, and
# dependency-watchdog's beside it.
RECORD = "dwd-lease.gardener.cloud/scaled-down"
REPLICAS = "dependency-watchdog.gardener.cloud/replicas"
MELTDOWN = "dependency-watchdog.gardener.cloud/meltdown-protection-active"

SEVEN = {f"node-{i}" for i in range(7)}

# With FAST_ENV: lease duration 2 s + confirm period 1 s, then the levels; recovery period 2 s.
OUTAGE_S = 30


def scale_patch(name: str) -> str:
    """The PATCHes that change a Deployment: the object (annotations) and its scale subresource."""
    return rf"/deployments/{name}(/scale)?$"


def judging(shoot: Shoot, *, seed: FaultProxy | None = None, **env: str) -> None:
    """An aggregator that has watched every lease for longer than one lease duration."""
    shoot.start_aggregator(env, seed=seed)
    shoot.wait_leases_renewed()
    time.sleep(3)  # the aggregator judges nothing for one lease duration after it starts


def recorded(shoot: Shoot) -> dict[str, dict[str, str]]:
    """Our annotations on each controller (empty when none is left)."""
    return {
        name: {
            k: v
            for k, v in (d["metadata"].get("annotations") or {}).items()
            if k in (RECORD, REPLICAS, MELTDOWN)
        }
        for name, d in shoot.deployments().items()
    }


def quiet(proxy: FaultProxy, *, quiet_s: float, within_s: float) -> None:
    """Wait until no request has matched any rule for ``quiet_s`` (at most ``within_s``)."""
    last, since = sum(r.hits for r in proxy.rules), time.monotonic()

    def quiet_long_enough() -> bool:
        nonlocal last, since
        now = sum(r.hits for r in proxy.rules)
        if now != last:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= quiet_s

    eventually(quiet_long_enough, within_s)  # not quiet within it: the test goes on regardless


def restored(shoot: Shoot) -> bool:
    return shoot.replicas() == CONTROLLERS and not any(recorded(shoot).values())


def state(shoot: Shoot) -> str:
    return f"replicas {shoot.replicas()}, annotations {recorded(shoot)}"


def at(sample: Sample | None, since: float) -> str:
    return "" if sample is None else f"{sample.t - since:+.1f}s: replicas {sample.replicas}"


@pytest.mark.timeout(300)
def test_shoot_kapi_restart_is_not_an_outage(shoot: Shoot) -> None:
    """KAPI down for longer than lease duration + confirm period, then back: every lease is
    renewed again one second after /readyz turns 200 (a load balancer admits traffic only
    then). Nothing was wrong with the nodes; no controller may be scaled down."""
    shoot.setup()
    judging(shoot)
    sampler = shoot.sampler()
    nodes = set(shoot.driver.alive)
    for cycle in range(3):
        shoot.shoot.stop_apiserver()
        # Only once KAPI is down: with KAPI up, silent leases would be a real outage.
        shoot.driver.alive.clear()
        time.sleep(7)
        shoot.shoot.start_apiserver()  # returns once /readyz answers 200
        back = time.monotonic()
        time.sleep(1)
        shoot.driver.alive |= nodes
        time.sleep(10)
        dip = sampler.first(lambda s: any(s.replicas[n] < r for n, r in CONTROLLERS.items()))
        assert dip is None, (
            f"cycle {cycle + 1}: scaled down after a KAPI restart, {at(dip, back)} after /readyz was 200"
        )


@pytest.mark.timeout(180)
def test_partial_scale_down_is_undone_when_the_nodes_recover(shoot: Shoot) -> None:
    """KCM cannot be scaled down (the seed fails its PATCHes) while MCM and CA already are;
    the nodes recover and the seed heals: every controller must run again, records gone."""
    shoot.setup()
    proxy = shoot.seed_proxy()
    judging(shoot, seed=proxy)
    kcm = proxy.fail(500, method="PATCH", path=scale_patch(KCM))
    shoot.driver.alive -= SEVEN
    wait_for(
        lambda: shoot.replicas()[MCM] == 0 and shoot.replicas()[CA] == 0, OUTAGE_S, "MCM and CA scaled down"
    )
    assert shoot.replicas()[KCM] == CONTROLLERS[KCM], "the fault did not keep KCM up"
    shoot.driver.alive |= SEVEN
    # The seed heals only once the aggregator has stopped trying to scale KCM down (no try
    # for longer than its retry back-off): healed sooner, a retry would finish the
    # scale-down and what follows would be the plain recovery.
    quiet(proxy, quiet_s=5, within_s=30)
    assert kcm.hits >= 1, "the aggregator never tried to scale KCM down"
    proxy.clear()
    ok = eventually(lambda: restored(shoot), 30)
    assert ok, f"30s after nodes and seed recovered, still {state(shoot)}"


@pytest.mark.timeout(180)
def test_relapse_during_a_partial_scale_up_scales_kcm_down_again(shoot: Shoot) -> None:
    """The nodes recover, KCM is scaled up but MCM cannot be (the seed fails its scale
    PATCH); the nodes fail again. KCM must not be left running through the new outage."""
    shoot.setup()
    proxy = shoot.seed_proxy()
    judging(shoot, seed=proxy)
    shoot.driver.alive -= SEVEN
    wait_for(lambda: shoot.replicas() == DOWN, OUTAGE_S, "every controller scaled down", every_s=0.1)
    mcm = proxy.fail(500, method="PATCH", path=scale_patch(MCM))
    shoot.driver.alive |= SEVEN
    wait_for(lambda: shoot.replicas()[KCM] == CONTROLLERS[KCM], OUTAGE_S, "KCM scaled up", every_s=0.1)
    wait_for(lambda: mcm.hits >= 1, 10, "the scale-up to reach MCM")
    assert shoot.replicas()[MCM] == 0
    shoot.driver.alive -= SEVEN
    ok = eventually(lambda: shoot.replicas()[KCM] == 0, 20)
    assert ok, f"20s into the relapse (7/10 nodes silent), still {state(shoot)}"


@pytest.mark.timeout(120)
def test_too_few_candidates_while_down_restores_the_controllers(shoot: Shoot) -> None:
    """Scaled down, then nodes are deleted until fewer than DWD_MIN_CANDIDATES (2) remain: no
    verdict is possible any more, so the controllers must run, not stay at zero forever."""
    shoot.setup(nodes=3)
    judging(shoot)
    shoot.driver.alive -= {"node-0", "node-1"}  # 2/3 silent
    wait_for(lambda: shoot.replicas() == DOWN, OUTAGE_S, "every controller scaled down", every_s=0.1)
    for node in ("node-0", "node-1"):
        shoot.shoot_admin.delete(f"/api/v1/nodes/{node}")
    ok = eventually(lambda: restored(shoot), 20)  # recovery period 2 s and a generous margin
    assert ok, f"20s after only one (healthy) candidate was left, still {state(shoot)}"


@pytest.mark.timeout(120)
def test_kcm_is_not_scaled_down_while_mcm_still_runs(shoot: Shoot) -> None:
    """MCM cannot be scaled down (the seed fails every scale PATCH on it): KCM, which must
    outlive MCM, may never be at zero while MCM runs."""
    shoot.setup()
    proxy = shoot.seed_proxy()
    judging(shoot, seed=proxy)
    mcm = proxy.fail(500, method="PATCH", path=scale_patch(MCM))
    sampler = shoot.sampler()
    shoot.driver.alive -= SEVEN
    cut = time.monotonic()
    time.sleep(20)
    assert mcm.hits >= 1, "the aggregator never tried to scale MCM down"
    bad = sampler.first(lambda s: s.replicas[KCM] == 0 and s.replicas[MCM] > 0)
    assert bad is None, f"KCM at 0 while MCM still runs, {at(bad, cut)} after the cut"


@pytest.mark.timeout(120)
def test_mcm_and_ca_wait_for_kcm_on_the_way_up(shoot: Shoot) -> None:
    """KCM cannot be scaled up (the seed fails its scale PATCH): MCM and CA, which need KCM,
    must not come back before it does."""
    shoot.setup()
    proxy = shoot.seed_proxy()
    judging(shoot, seed=proxy)
    shoot.driver.alive -= SEVEN
    wait_for(lambda: shoot.replicas() == DOWN, OUTAGE_S, "every controller scaled down", every_s=0.1)
    kcm = proxy.fail(500, method="PATCH", path=scale_patch(KCM))
    sampler = shoot.sampler()
    shoot.driver.alive |= SEVEN
    healed = time.monotonic()
    time.sleep(20)
    assert kcm.hits >= 1, "the aggregator never tried to scale KCM up"
    bad = sampler.first(lambda s: s.replicas[KCM] == 0 and (s.replicas[MCM] > 0 or s.replicas[CA] > 0))
    assert bad is None, f"MCM or CA back before KCM, {at(bad, healed)} after the nodes recovered"
    proxy.clear()
    wait_for(lambda: restored(shoot), 30, "every controller back once the seed heals", every_s=0.2)


@pytest.mark.timeout(240)
def test_a_deposed_leader_never_writes_again(shoot: Shoot) -> None:
    """The leader's seed connection goes into a black hole in the middle of a scale-up; the
    standby takes over, finishes the recovery and later scales down for a new outage. When
    the old leader's connection comes back, it must not touch the controllers again."""
    shoot.setup()
    election = shoot.election_env()
    proxy = shoot.seed_proxy()
    shoot.start_aggregator(election, seed=proxy)
    old = wait_for(shoot.election_holder, 30, "the first aggregator to lead")
    shoot.start_aggregator(election)
    shoot.wait_leases_renewed()
    time.sleep(4)

    shoot.driver.alive -= SEVEN
    wait_for(lambda: shoot.replicas() == DOWN, OUTAGE_S, "the leader's scale-down", every_s=0.1)
    # The leader's first scale-up write fails; its retry finds the black hole.
    first_up = proxy.fail(500, method="PATCH", path=scale_patch(KCM), count=1)
    shoot.driver.alive |= SEVEN
    wait_for(lambda: first_up.hits == 1, OUTAGE_S, "the leader's scale-up to begin", every_s=0.01)
    proxy.blackhole(True)
    wait_for(lambda: shoot.election_holder() not in ("", old), 20, "the standby to take over", every_s=0.2)
    wait_for(lambda: restored(shoot), OUTAGE_S, "the new leader's recovery", every_s=0.1)

    shoot.driver.alive -= SEVEN
    wait_for(lambda: shoot.replicas() == DOWN, OUTAGE_S, "the new leader's scale-down", every_s=0.1)
    sampler = shoot.sampler()
    proxy.blackhole(False)
    proxy.clear()
    released = time.monotonic()
    time.sleep(30)  # the nodes stay silent: nothing may run

    def late_writes() -> list[str]:
        return [
            f"{s.method} {s.path} -> {s.status} at {s.t - released:+.1f}s"
            for s in list(proxy.seen)
            if s.t >= released and s.method != "GET" and "/deployments/" in s.path
        ]

    bad = sampler.first(lambda s: any(s.replicas.values()))
    assert bad is None, (
        f"a controller runs during the outage, {at(bad, released)} after the old leader's seed came"
        f" back; its writes since: {late_writes()}"
    )
    assert not late_writes(), "the deposed leader wrote to the controllers"
    assert shoot.election_holder() != old
