"""dependency-watchdog's candidate rules against real API servers: the Machines from a real
Machine CRD in the seed, the conditions from real Node status in the shoot."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.gardener.seed_objects import MACHINE_CRD
from testenv.kube.controllers import CONTROLLERS, DOWN
from testenv.kube.controlplane import free_port
from testenv.worlds.shoot_world import Shoot
from tests.integration.test_service import target

pytestmark = pytest.mark.integration

CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/machines.machine.sapcloud.io"


@pytest.fixture
def machine_crd(shoot: Shoot) -> Iterator[Client]:
    seed = shoot.seed_admin
    seed.create(CRD.rsplit("/", 1)[0], MACHINE_CRD)
    try:
        wait_for(lambda: _established(seed), 20, "the Machine CRD established")
        yield seed
    finally:
        # The seed is shared by the session: the next tests' seeds serve no Machines.
        seed.delete(CRD)


def _established(seed: Client) -> bool:
    crd = seed.get(CRD)
    return any(
        c["type"] == "Established" and c["status"] == "True"
        for c in (crd.get("status") or {}).get("conditions") or []
    )


def _machine(seed: Client, namespace: str, node: str, phase: str) -> None:
    path = f"/apis/machine.sapcloud.io/v1alpha1/namespaces/{namespace}/machines"
    seed.create(
        path,
        {
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": f"m-{node}", "labels": {"node": node}},
        },
    )
    # As MCM writes it: through the status subresource.
    seed.merge_patch(f"{path}/m-{node}/status", {"status": {"currentStatus": {"phase": phase}}})


def _condition(shoot: Shoot, node: str, kind: str, reason: str = "") -> None:
    condition: dict[str, Any] = {"type": kind, "status": "True", "reason": reason or kind}
    shoot.shoot_admin.merge_patch(f"/api/v1/nodes/{node}/status", {"status": {"conditions": [condition]}})


def test_each_rule_leaves_its_node_out_of_the_verdict_and_says_why(shoot: Shoot, machine_crd: Client) -> None:
    """Five of ten nodes are left out, each by its own rule. Six silent (60 % of all) is then 1
    of 5 candidates: nothing happens; four of the five candidates silent is a quorum lost."""
    shoot.setup()
    ns = shoot.namespace
    _machine(machine_crd, ns, "node-0", "Failed")
    _machine(machine_crd, ns, "node-1", "Terminating")
    _machine(machine_crd, ns, "node-6", "Running")
    _condition(shoot, "node-3", "InPlaceUpdate", reason="ReadyForUpdate")
    shoot.shoot_admin.merge_patch(
        "/api/v1/nodes/node-4", {"metadata": {"labels": {"worker.gardener.cloud/pool": "gpu"}}}
    )
    _condition(shoot, "node-4", "GPUUnhealthy")
    _condition(shoot, "node-5", "DiskPressure")
    port = free_port()
    shoot.start_aggregator(
        {
            "DWD_METRICS_ADDR": f"127.0.0.1:{port}",
            "DWD_NODE_CONDITIONS": '{"gpu": ["GPUUnhealthy"], "*": ["DiskPressure"]}',
        }
    )
    shoot.wait_leases_renewed()
    wait_for(lambda: target(port, ns).get("phase") == "healthy", 20, "healthy")
    t = target(port, ns)
    assert t["skipped"] == {
        "node-0": "machine Failed",
        "node-1": "machine Terminating",
        "node-3": "in-place update",
        "node-4": "an unhealthy condition (GPUUnhealthy)",
        "node-5": "an unhealthy condition (DiskPressure)",
    }
    assert t["machines"]["rule"] == "on" and t["machines"]["error"] == ""
    wait_for(lambda: target(port, ns).get("candidates") == 5, 10, "five candidates")

    shoot.driver.alive -= {"node-0", "node-1", "node-3", "node-4", "node-5", "node-6"}
    time.sleep(5)  # FAST_ENV's lease duration 2 s, confirm 1 s: a counted 6/10 would be down by now
    assert shoot.replicas() == CONTROLLERS
    assert (target(port, ns)["stale"], target(port, ns)["candidates"]) == (1, 5)

    shoot.driver.alive -= {"node-7", "node-8", "node-9"}
    wait_for(lambda: shoot.replicas() == DOWN, 20, "every controller scaled down", every_s=0.1)
