"""The aggregator as its own process against a real shoot API server and a real seed API server."""

from __future__ import annotations

import time

import pytest

from aggregator.model.records import IGNORE_SCALING, MELTDOWN, REPLICAS
from core.lease import DEFAULT_LEASE_NAMESPACE, RELEASED, node_lease_path
from testenv.base.wait import wait_for
from testenv.kube.controllers import CONTROLLERS, DOWN
from testenv.worlds.shoot_world import Shoot

pytestmark = pytest.mark.integration


def test_quorum_lost_scales_down_in_order_and_back_up_exactly(shoot: Shoot) -> None:
    """As the seed runs it: the aggregator's own ServiceAccount under the shipped RBAC and
    admission policy (manifests/seed), whose every write, scale-down, record, Event and
    scale-up, the policy judges."""
    shoot.setup()
    agg = shoot.start_aggregator({"DWD_SEED_KUBECONFIG": str(shoot.seed_service_account())})
    shoot.wait_leases_renewed()
    time.sleep(3)  # the aggregator waits one lease duration after start
    cut = time.monotonic()
    shoot.driver.alive -= {f"node-{i}" for i in range(7)}
    wait_for(lambda: shoot.replicas() == DOWN, 30, "every controller scaled down", every_s=0.1)
    took = time.monotonic() - cut
    wait_for(lambda: agg.names().count("resource_scaled_down") == 3, 10, "the scale-down logged")
    assert shoot.annotation("kube-controller-manager", REPLICAS) == "3"
    assert shoot.annotation("machine-controller-manager", REPLICAS) == "2"
    assert shoot.annotation("cluster-autoscaler", REPLICAS) == "1"
    assert shoot.annotation("kube-controller-manager", MELTDOWN) == ""
    # MCM and CA (level 0) before KCM (level 1)
    order = [e["resource"] for e in agg.events() if e["event"] == "resource_scaled_down"]
    assert order[-1] == "kube-controller-manager", order
    assert set(order[:2]) == {"machine-controller-manager", "cluster-autoscaler"}
    reasons = {e["reason"] for e in shoot.events()}
    assert "ScaledDown" in reasons
    # FAST_ENV's lease duration 2s + confirm 1s + ticks: well under 10 s
    assert took < 10, took

    shoot.driver.alive |= {f"node-{i}" for i in range(7)}
    wait_for(lambda: shoot.replicas() == CONTROLLERS, 30, "every controller back", every_s=0.1)
    wait_for(lambda: agg.names().count("resource_scaled_up") == 3, 10, "the scale-up logged")
    up = [e["resource"] for e in agg.events() if e["event"] == "resource_scaled_up"]
    assert up == ["kube-controller-manager", "machine-controller-manager", "cluster-autoscaler"]
    for name in CONTROLLERS:
        assert shoot.annotation(name, REPLICAS) is None
        assert shoot.annotation(name, MELTDOWN) is None
    assert "ScaledUp" in {e["reason"] for e in shoot.events()}


def test_minority_stale_does_nothing(shoot: Shoot) -> None:
    shoot.setup()
    agg = shoot.start_aggregator()
    shoot.wait_leases_renewed()
    time.sleep(3)
    shoot.driver.alive -= {"node-0", "node-1", "node-2"}
    time.sleep(6)
    assert shoot.replicas() == CONTROLLERS
    assert "target_scale_down" not in agg.names()
    assert agg.alive()


def test_kapi_probe_failure_blocks_the_scale_down(shoot: Shoot) -> None:
    """The shoot's API server answers the aggregator's LISTs but not its /readyz (not ready: the
    load balancer would take it out): the agents' silence means nothing, nothing is lowered."""
    shoot.setup()
    proxy = shoot.shoot_proxy()
    agg = shoot.start_aggregator(
        {"DWD_SHOOT_KUBECONFIG": str(proxy.kubeconfig(shoot.tmp / "shoot-proxy.kubeconfig"))}
    )
    shoot.wait_leases_renewed()
    time.sleep(3)
    proxy.fail(503, path="^/readyz$")
    shoot.driver.alive.clear()
    wait_for(lambda: "scale_down_blocked" in agg.names(), 30, "a blocked scale-down", every_s=0.2)
    time.sleep(2)
    assert shoot.replicas() == CONTROLLERS
    blocked = [e for e in agg.events() if e["event"] == "scale_down_blocked"]
    assert blocked[0]["why"].startswith("kapi_probe_failed")


def test_sigkill_mid_scale_down_converges_and_restores(shoot: Shoot) -> None:
    shoot.setup()
    agg = shoot.start_aggregator()
    shoot.wait_leases_renewed()
    time.sleep(3)
    shoot.driver.alive -= {f"node-{i}" for i in range(8)}
    # Killed as soon as the first record is written: the scale-down is half done.
    wait_for(
        lambda: any(shoot.annotation(n, REPLICAS) for n in CONTROLLERS), 30, "the first record", every_s=0.02
    )
    agg.kill()
    # KCM (level 1) waits for level 0 to be observed scaled: it cannot be down yet.
    assert shoot.replicas()["kube-controller-manager"] == 3
    again = shoot.start_aggregator()
    wait_for(lambda: shoot.replicas() == DOWN, 30, "the restarted aggregator to converge", every_s=0.1)
    assert {n: shoot.annotation(n, REPLICAS) for n in CONTROLLERS} == {
        k: str(v) for k, v in CONTROLLERS.items()
    }
    shoot.driver.alive |= {f"node-{i}" for i in range(8)}
    wait_for(lambda: shoot.replicas() == CONTROLLERS, 30, "recovery with the old replicas", every_s=0.1)
    assert again.alive()


def test_ignore_scaling_is_left_alone(shoot: Shoot) -> None:
    shoot.setup()
    shoot.seed_admin.merge_patch(
        f"/apis/apps/v1/namespaces/{shoot.namespace}/deployments/cluster-autoscaler",
        {"metadata": {"annotations": {IGNORE_SCALING: "true"}}},
    )
    shoot.start_aggregator()
    shoot.wait_leases_renewed()
    time.sleep(3)
    shoot.driver.alive -= {f"node-{i}" for i in range(7)}
    wait_for(lambda: shoot.replicas()["kube-controller-manager"] == 0, 30, "KCM scaled down", every_s=0.1)
    assert shoot.replicas() == {**DOWN, "cluster-autoscaler": 1}
    assert shoot.annotation("cluster-autoscaler", REPLICAS) is None


def test_released_leases_are_not_an_outage(shoot: Shoot) -> None:

    shoot.setup()
    agg = shoot.start_aggregator()
    shoot.wait_leases_renewed()
    time.sleep(3)
    # Every agent stops on purpose: marks its lease released, then stops renewing.
    for node in list(shoot.driver.alive):
        shoot.shoot_admin.merge_patch(
            node_lease_path(DEFAULT_LEASE_NAMESPACE, node), {"metadata": {"annotations": {RELEASED: "true"}}}
        )
    shoot.driver.alive.clear()
    time.sleep(6)
    assert shoot.replicas() == CONTROLLERS
    assert "target_scale_down" not in agg.names()


def test_node_deleted_lease_deleted(shoot: Shoot) -> None:
    shoot.setup(nodes=3)
    shoot.start_aggregator()
    shoot.wait_leases_renewed()
    lease = shoot.leases()["node-2"]
    assert lease["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert lease["spec"]["leaseDurationSeconds"] == 2
    shoot.shoot_admin.delete("/api/v1/nodes/node-2")
    wait_for(lambda: "node-2" not in shoot.leases(), 10, "the lease of the deleted node to go")
    assert set(shoot.leases()) == {"node-0", "node-1"}


def test_watch_gone_relists_without_a_wrong_verdict(shoot: Shoot) -> None:
    shoot.setup()
    agg = shoot.start_aggregator()
    shoot.wait_leases_renewed()
    time.sleep(3)
    # The restarted API server's watch cache starts at a compacted revision: the
    # aggregator's resumed watch gets 410 Gone and must re-list.
    shoot.shoot.compact_etcd()
    shoot.shoot.stop_apiserver()
    shoot.shoot.start_apiserver()
    wait_for(lambda: "watch_expired_relisting" in agg.names(), 30, "a 410 and a re-list", every_s=0.2)
    time.sleep(4)
    assert shoot.replicas() == CONTROLLERS
    assert "target_scale_down" not in agg.names()
    # And the watch works after the re-list: a real outage is still seen.
    shoot.driver.alive -= {f"node-{i}" for i in range(7)}
    wait_for(lambda: shoot.replicas() == DOWN, 30, "the scale-down after the re-list", every_s=0.1)


def test_write_budget_paces_a_sample_and_judges_only_it(shoot: Shoot) -> None:
    import httpx

    from testenv.kube.controlplane import free_port

    shoot.setup(nodes=40)
    port = free_port()
    # 40 nodes at 500ms would be 80 writes/s; the budget allows 50.
    agg = shoot.start_aggregator({"DWD_WRITE_BUDGET": "50", "DWD_METRICS_ADDR": f"127.0.0.1:{port}"})
    shoot.wait_leases_renewed()
    wait_for(
        lambda: (
            sorted(
                lease["metadata"]["annotations"]["dependency-watchdog.gardener.cloud/renew-interval"]
                for lease in shoot.leases().values()
            ).count("500ms")
            == 24
        ),
        20,
        "24 fast leases",
    )
    leases = shoot.leases()
    fast = sorted(n for n, lease in leases.items() if lease["spec"]["leaseDurationSeconds"] == 2)
    slow = sorted(n for n, lease in leases.items() if lease["spec"]["leaseDurationSeconds"] == 240)
    assert (len(fast), len(slow)) == (24, 16)
    assert {
        leases[n]["metadata"]["annotations"]["dependency-watchdog.gardener.cloud/renew-interval"]
        for n in slow
    } == {"1m0s"}
    time.sleep(3)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).text
    assert f'dwd_target_heartbeat_writes_per_second{{target="{shoot.namespace}"}} 48.2' in text

    # All slow nodes and 10 fast ones go quiet: 26/40 would be a quorum, 10/24 of the sample is not.
    shoot.driver.alive -= {*slow, *fast[:10]}
    time.sleep(5)
    assert shoot.replicas() == CONTROLLERS
    assert "target_scale_down" not in agg.names()
    shoot.driver.alive -= set(fast[10:15])  # 15/24 of the sample
    wait_for(lambda: shoot.replicas() == DOWN, 30, "the scale-down on the sample's verdict", every_s=0.1)
