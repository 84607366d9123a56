"""The real kubelet (kubemark's hollow node) against the test control plane: it registers, turns
Ready, renews its node lease as kubelet does, and its node identity is judged by the Node
authorizer and NodeRestriction."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from testenv.base.kapi import Client, denial
from testenv.base.wait import wait_for
from testenv.kube.controlplane import ControlPlane
from testenv.kube.hollow import HollowKubelet, lease_path, node_lease, ready_condition, renew_time

pytestmark = pytest.mark.integration

NODE = "hollow-node-0"
OTHER = "hollow-node-other"


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HollowKubelet]:
    hollow = HollowKubelet(NODE, control_plane, tmp_path_factory.mktemp("hollow")).start()
    try:
        yield hollow
    finally:
        hollow.stop()


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Iterator[Client]:
    with control_plane.admin_client() as c:
        yield c


def _renewed(admin: Client, kubelet: HollowKubelet) -> datetime | None:
    assert kubelet.alive(), kubelet.tail()
    return renew_time(node_lease(admin, NODE))


def test_it_registers_turns_ready_and_renews_its_lease_every_ten_seconds(
    admin: Client, kubelet: HollowKubelet
) -> None:
    def ready() -> bool:
        assert kubelet.alive(), kubelet.tail()
        nodes = admin.get("/api/v1/nodes", fieldSelector=f"metadata.name={NODE}")["items"]
        return bool(nodes) and (ready_condition(nodes[0]) or {}).get("status") == "True"

    wait_for(ready, 60, f"{NODE} registered and Ready", every_s=0.5)
    # Its first lease waits for a lease controller pass after the Node exists (up to 10 s).
    first = wait_for(lambda: _renewed(admin, kubelet), 30, "its lease in kube-node-lease", every_s=0.5)
    lease = node_lease(admin, NODE)
    assert lease is not None
    assert lease["spec"]["leaseDurationSeconds"] == 40
    assert lease["spec"]["holderIdentity"] == NODE
    # kubelet's owner reference ties the lease to its Node (garbage-collected with it).
    assert [o["kind"] for o in lease["metadata"].get("ownerReferences", [])] == ["Node"]
    # A quarter of 40 s, stretched by up to 4 %, plus the write.
    later = wait_for(
        lambda: (t := _renewed(admin, kubelet)) and t > first and t, 15, "a renewal", every_s=0.2
    )
    assert 9.9 <= (later - first).total_seconds() <= 11.5


def test_its_node_credentials_write_its_own_lease_only(admin: Client, kubelet: HollowKubelet) -> None:
    wait_for(lambda: node_lease(admin, NODE), 40, "its lease")
    others = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    spec = {"holderIdentity": OTHER, "leaseDurationSeconds": 40}
    admin.ensure(others, {"metadata": {"name": OTHER}, "spec": spec})
    with kubelet.client() as node:
        # The certificate is accepted: it reads its own lease.
        assert node.get(lease_path(NODE))["metadata"]["name"] == NODE
        same_name = "can only access node lease with the same name as the requesting node"
        # Another node's lease by name: the Node authorizer refuses it.
        refused = denial(lambda: node.merge_patch(lease_path(OTHER), {"spec": {"holderIdentity": NODE}}))
        assert same_name in refused and f'User "system:node:{NODE}" cannot patch' in refused
        # A create names no object the authorizer could judge: NodeRestriction refuses it.
        refused = denial(lambda: node.create(others, {"metadata": {"name": "hollow-node-x"}, "spec": spec}))
        assert same_name in refused and "cannot create" not in refused
