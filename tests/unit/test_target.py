"""One target's loops on the real clock, and each interlock's refusal as a value."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aggregator.act.interlocks import Interlock, Refusal
from aggregator.decide import decider
from aggregator.lead.scope import Scope
from aggregator.model import eligibility
from aggregator.model.settings import DeciderSettings, Settings, ShootSettings
from aggregator.model.verdict import Phase
from aggregator.shoot import Shared
from aggregator.target import Target
from core.lease import DEFAULT_LEASE_NAMESPACE, leases_path
from testenv.kube.controllers import CONTROLLERS
from tests.unit.fakekube import FakeKube, Rule, server_error
from tests.unit.world import NS, World, deployment_path


async def settled() -> World:
    w = World()
    await w.run(12)
    assert w.target.memory.phase is Phase.HEALTHY
    return w


async def test_run_reports_why_it_cannot_list_then_provisions_and_judges() -> None:
    shoot, seed = FakeKube(), FakeKube()
    for i in range(3):
        shoot.put(f"/api/v1/nodes/node-{i}", {"metadata": {"uid": f"uid-{i}"}})
    for name, replicas in CONTROLLERS.items():
        seed.put(deployment_path(name), {"spec": {"replicas": replicas}})
    quick = DeciderSettings(lease_duration_s=0.4, fast_interval_s=0.2, blind_limit_s=1.0, node_grace_s=0.0)
    settings = Settings(ShootSettings(namespace=NS), quick)
    target = Target("shoot", NS, shoot, Shared(settings, seed, World().dependents), scope=Scope())
    target.parts.provisioner.min_gap_s = 0.0
    shoot.fail("GET", "/api/v1/nodes$")
    task = asyncio.create_task(target.run())
    try:
        await asyncio.sleep(0.35)
        assert "injected" in target.status.error  # not listed yet: the status page says why
        assert target.status.view == "not listed yet"  # judging nothing, ticking all along
        shoot.clear()
        await asyncio.sleep(0.6)
        leases = [p for p in shoot.objects if p.startswith(leases_path(DEFAULT_LEASE_NAMESPACE) + "/")]
        assert len(leases) == 3  # the provisioner made one per node, as leader
        assert target.status.error == ""
        assert target.memory.phase is Phase.HEALTHY  # no record on the seed: a start continues healthy
        assert target.snapshot()["fast_nodes"] == 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_record_that_cannot_be_read_keeps_a_start_starting_and_says_so() -> None:
    w = World()
    w.seed.fail("GET", deployment_path("kube-controller-manager"))
    await w.run(3)
    assert w.target.memory.phase is Phase.STARTING
    assert w.target.status.error.startswith("reading the scale-down record: 500")


async def test_the_watch_interlock_refuses_when_the_watches_went_quiet() -> None:
    w = await settled()
    w.target.parts.nodes.failing = True
    refusal = await w.target.refusal()
    assert refusal is not None and refusal.interlock is Interlock.WATCH_STALE
    assert w.target.parts.view.since is None and w.target.parts.view.why == "no data from the watches"


async def test_the_list_interlock_refuses_when_the_confirming_list_fails() -> None:
    w = await settled()
    w.shoot.fail("GET", leases_path(DEFAULT_LEASE_NAMESPACE) + "$")
    refusal = await w.target.refusal()
    assert refusal is not None and refusal.interlock is Interlock.LIST_FAILED
    assert "injected" in refusal.detail
    assert w.target.parts.view.why == "the confirming LIST failed"


async def test_the_probe_and_the_confirming_list_are_sent_together() -> None:
    w = await settled()
    sent: list[str] = []
    w.shoot.on_request = lambda _method, path: sent.append(path)
    w.shoot.hang = Rule("GET", "/readyz$", server_error)
    checking = asyncio.create_task(w.target.refusal())
    await asyncio.sleep(0.05)
    # Sent while the probe has not answered: one round trip for the interlocks, not two.
    assert sent[0] == "/readyz" and leases_path(DEFAULT_LEASE_NAMESPACE) in sent
    checking.cancel()
    await asyncio.gather(checking, return_exceptions=True)


async def test_the_list_interlock_refuses_when_a_fresh_list_disagrees() -> None:
    w = await settled()
    refusal = await w.target.refusal()
    assert refusal == Refusal(Interlock.LIST_DISAGREES, "a fresh LIST shows 0/10 stale")
    assert str(refusal) == "list_disagrees: a fresh LIST shows 0/10 stale"  # /status keeps this shape


async def test_refused_scale_downs_are_counted_by_interlock() -> None:
    w = await settled()
    w.alive -= set(w.names[:7])
    for refusals in (1, 2):
        w.shoot.fail("GET", "/readyz")
        await w.run(30)
        blocked = w.target.metrics.blocked.get(target="shoot", reason="kapi_probe_failed")
        assert blocked == refusals  # every refusal counts
        assert w.target.snapshot()["blocked"].startswith("kapi_probe_failed: 500")
        # The refusal is a gap, and the view starts again only from a ready KAPI: no verdict
        # (and no refusal) until /readyz answers again.
        assert w.target.status.view.startswith("the shoot KAPI is not ready: 500")
        w.shoot.clear()
        await w.run(1)


async def test_a_zone_outage_shows_zone_by_zone_on_the_status_page_and_in_the_metrics() -> None:
    w = World()
    for i, name in enumerate(w.names):
        node = w.shoot.objects[f"/api/v1/nodes/{name}"]
        node["metadata"]["labels"] = {"topology.kubernetes.io/zone": "zone-a" if i < 6 else "zone-b"}
    await w.run(12)
    w.alive -= set(w.names[6:])  # zone-b loses its path: 40 %, below the failure fraction
    await w.run(10)
    assert w.target.memory.phase is Phase.HEALTHY
    assert w.target.snapshot()["zones"] == {
        "zone-a": {"candidates": 6, "stale": 0, "fraction": 0.0},
        "zone-b": {"candidates": 4, "stale": 4, "fraction": 1.0},
    }
    assert w.target.metrics.zone_fraction.get(target=w.target.name, zone="zone-b") == 1.0
    assert 'zone="zone-b"' in w.target.metrics.registry.render()


async def test_a_healthy_tick_walks_the_candidates_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 5000 nodes a walk over the candidates is a millisecond: the verdict carries the
    per-zone counts the status page shows, so a tick does not walk them again for those."""
    w = await settled()
    walks = 0
    walk = eligibility.eligibility  # what decider calls, by the name it imported

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal walks
        walks += 1
        return walk(*args, **kw)

    monkeypatch.setattr(decider, "eligibility", counting)
    await w.target.tick()
    assert walks == 1
    assert w.target.snapshot()["zones"] == {"": {"candidates": 10, "stale": 0, "fraction": 0.0}}


async def test_the_status_page_shows_the_fraction_the_verdict_judged_not_the_plain_count() -> None:
    """Zones of 270 and 30 nodes: the sample takes 20 of each (the per-zone minimum), so the
    small zone's outage is half the sample but a tenth of the nodes. The verdict judges the
    tenth; /status and the metric must say the same, or an operator reads 0.5 on a page whose
    threshold is 0.6 and wonders why nothing happens."""
    w = World(300, write_budget=20.0)
    for i, name in enumerate(w.names):
        node = w.shoot.objects[f"/api/v1/nodes/{name}"]
        node["metadata"]["labels"] = {"topology.kubernetes.io/zone": "zone-a" if i < 270 else "zone-b"}
    await w.run(20)
    w.alive -= set(w.names[270:])
    await w.run(12)
    snapshot = w.target.snapshot()
    assert (snapshot["candidates"], snapshot["stale"]) == (40, 20)
    assert snapshot["fraction"] == pytest.approx(0.1)
    assert w.target.metrics.fraction.get(target=w.target.name) == pytest.approx(0.1)
    assert w.target.memory.phase is Phase.HEALTHY


async def test_a_refused_scale_down_leaves_the_watches_synced() -> None:
    """dwd_target_synced says whether the watches have listed and are fresh: a failed probe is
    a gap in the view (nothing is judged for a lease duration), not a watch out of sync."""
    w = await settled()
    w.alive -= set(w.names[:7])
    w.shoot.fail("GET", "/readyz")
    synced_on_refusal = []
    for _ in range(20):
        before = w.target.metrics.probe_failures.get(target="shoot")
        await w.step()
        if w.target.metrics.probe_failures.get(target="shoot") > before:
            synced_on_refusal.append(w.target.metrics.synced.get(target="shoot"))
            assert "probe" in w.target.status.view  # the gap is on the status page
    assert synced_on_refusal and set(synced_on_refusal) == {1.0}, synced_on_refusal
