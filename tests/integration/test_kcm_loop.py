"""A real kube-controller-manager in the loop: real kubelets (kubemark's hollow node), a workload, KCM
run from the seed's Deployment. What KCM does to a node whose kubelet stops renewing, and that it
does nothing while at 0."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.kube import workload
from testenv.kube.controlplane import ControlPlane, ensure_namespace
from testenv.kube.hollow import HollowKubelet, renewals
from testenv.kube.kcm import KCM_DEPLOYMENT, MARKS_WITHIN_S, KcmDeploymentController, KcmReplicas
from testenv.kube.kcm import NODE_GRACE_S as GRACE_S
from testenv.kube.kubelet_identity import NODE_LEASE_NAMESPACE
from testenv.kube.standins import DEPLOYMENTS, deployment

pytestmark = pytest.mark.integration

NODES = [f"node-{i}" for i in range(3)]
# A running KCM has had the time to mark a node, and 5 s more.
PAST_GRACE_S = MARKS_WITHIN_S + 5


@dataclass
class KcmLoop:
    shoot: ControlPlane
    seed: ControlPlane
    namespace: str
    tmp: Path
    kubelets: dict[str, HollowKubelet] = field(default_factory=dict)
    shoot_admin: Client = field(init=False)
    seed_admin: Client = field(init=False)
    kcm: KcmReplicas = field(init=False)
    controller: KcmDeploymentController = field(init=False)

    def start(self) -> KcmLoop:
        self.shoot_admin = self.shoot.admin_client()
        self.seed_admin = self.seed.admin_client()
        # kube-apiserver creates kube-node-lease itself, shortly after it is ready.
        wait_for(lambda: self._has_namespace(NODE_LEASE_NAMESPACE), 20, "kube-node-lease")
        for node in NODES:
            self.kubelets[node] = HollowKubelet(node, self.shoot, self.tmp / "kubelets").start()
        workload.deploy(self.shoot_admin, NODES)
        ensure_namespace(self.seed_admin, self.namespace)
        self.seed_admin.create(DEPLOYMENTS.format(ns=self.namespace), deployment(KCM_DEPLOYMENT, 1))
        self.kcm = KcmReplicas(self.shoot, self.tmp / "kcm")
        self.controller = KcmDeploymentController(self.seed.admin_client(), self.namespace, self.kcm)
        self.controller.start()
        wait_for(self.all_healthy, 90, "3 nodes and pods Ready, 3 ready endpoints", every_s=0.5)
        # A kubelet's first lease waits for a pass of its lease controller after it registered.
        wait_for(lambda: len(self.renewals()) == len(NODES), 30, "every kubelet's lease", every_s=0.5)
        return self

    def renewals(self) -> dict[str, float]:
        for k in self.kubelets.values():
            assert k.alive(), k.tail()
        return renewals(self.shoot_admin, NODES)

    def _has_namespace(self, name: str) -> bool:
        with contextlib.suppress(Exception):
            self.shoot_admin.get(f"/api/v1/namespaces/{name}")
            return True
        return False

    def observe(self) -> workload.Observation:
        return workload.observe(self.shoot_admin)

    def all_healthy(self) -> bool:
        o = self.observe()
        return (
            sorted(o.nodes) == NODES
            and not o.unknown()
            and all(s == "True" for s in o.nodes.values())
            and not o.pods_not_ready()
            and len(o.pods) == len(NODES)
            and o.ready_endpoints == len(NODES)
        )

    def scale_kcm(self, replicas: int) -> None:
        self.seed_admin.merge_patch(
            f"{DEPLOYMENTS.format(ns=self.namespace)}/{KCM_DEPLOYMENT}", {"spec": {"replicas": replicas}}
        )

    def close(self) -> None:
        for k in self.kubelets.values():
            k.stop()
        with contextlib.suppress(AttributeError):
            self.controller.stop()  # stops the KCM processes too
        with contextlib.suppress(AttributeError):
            self.shoot_admin.close()
            self.seed_admin.close()


@pytest.fixture
def loop(seed_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[KcmLoop]:
    namespace = "shoot--kcm--" + request.node.name.lower().replace("_", "-")[5:35].strip("-")
    with ControlPlane().running() as shoot:
        lp = KcmLoop(shoot, seed_plane, namespace, tmp_path)
        try:
            yield lp.start()
        finally:
            lp.close()


@pytest.mark.timeout(180)
def test_kcm_marks_a_silent_node_unknown_after_its_grace(loop: KcmLoop) -> None:
    assert loop.kcm.count() == 1
    silent = loop.kubelets["node-2"]
    silent.pause()
    last = loop.renewals()["node-2"]  # its heartbeat; the real kubelet posts an unchanged status each 5 min
    o = wait_for(lambda: (o := loop.observe()).unknown() and o, 70, "a node Unknown", every_s=0.25)
    seen = time.time()
    after = seen - last
    print(f"\nnode-2 Ready=Unknown {after:.1f} s after its last renewal (grace {GRACE_S} s)")
    assert o.unknown() == ["node-2"]
    # Not before the grace; within one monitor period (5 s) plus slack after it.
    assert GRACE_S <= after <= GRACE_S + 15, after

    def node2_out() -> workload.Observation | None:
        ob = loop.observe()
        return ob if ob.pods.get("node-2") == "False" and ob.ready_endpoints == 2 else None

    o = wait_for(node2_out, 15, "node-2's pod NotReady and 2 ready endpoints", every_s=0.25)
    print(f"pod NotReady and endpoints 3 -> 2 {time.time() - last:.1f} s after the last renewal")
    assert o.nodes == {"node-0": "True", "node-1": "True", "node-2": "Unknown"}
    assert o.pods_not_ready() == ["node-2"]


@pytest.mark.timeout(300)
def test_kcm_at_zero_marks_nothing_and_a_restarted_kcm_neither(loop: KcmLoop) -> None:
    started = time.monotonic()
    loop.scale_kcm(0)
    wait_for(lambda: loop.kcm.count() == 0, 10, "no KCM process", every_s=0.1)
    print(f"\nKCM at 0 processes {time.monotonic() - started:.1f} s after the scale-down")
    wait_for(
        lambda: (
            (loop.seed_admin.get(f"{DEPLOYMENTS.format(ns=loop.namespace)}/{KCM_DEPLOYMENT}")["status"]).get(
                "readyReplicas", 0
            )
            == 0
        ),
        5,
        "the Deployment's status at 0 ready",
    )

    silent = loop.kubelets["node-2"]
    silent.pause()
    cut = time.time()
    last = loop.renewals()["node-2"]
    while time.time() - cut < PAST_GRACE_S:
        o = loop.observe()
        assert not o.unknown(), o
        assert not o.pods_not_ready(), o
        assert o.ready_endpoints == 3, o
        time.sleep(1)
    print(f"node-2 silent {time.time() - last:.0f} s: no node Unknown")

    silent.resume()
    wait_for(lambda: loop.renewals()["node-2"] > cut, 15, "node-2 renewing again", every_s=0.2)
    loop.scale_kcm(1)
    up = time.monotonic()
    wait_for(lambda: loop.kcm.ready() == 1, 30, "KCM healthy again", every_s=0.2)
    print(f"KCM healthy {time.monotonic() - up:.1f} s after the scale-up")
    back = time.time()
    while time.time() - back < PAST_GRACE_S:
        o = loop.observe()
        assert not o.unknown(), o
        assert o.ready_endpoints == 3, o
        time.sleep(1)
    assert loop.kcm.count() == 1
    # The restarted KCM did lead while watched: it took over the leader lease.
    assert loop.kcm.started == 2
    assert "Successfully acquired lease" in loop.kcm.logs()[-1].read_text(errors="replace")


@pytest.mark.timeout(120)
def test_a_dead_kcm_is_restarted_and_status_follows(loop: KcmLoop) -> None:
    path = f"{DEPLOYMENTS.format(ns=loop.namespace)}/{KCM_DEPLOYMENT}"
    first = loop.kcm.procs[0]
    first.popen.kill()
    killed = time.monotonic()
    wait_for(lambda: loop.kcm.started == 2 and loop.kcm.ready() == 1, 30, "a new KCM healthy", every_s=0.1)
    print(f"\nKCM restarted and healthy {time.monotonic() - killed:.1f} s after a SIGKILL")
    assert loop.kcm.procs[0].pid != first.pid
    wait_for(lambda: loop.seed_admin.get(path)["status"].get("readyReplicas") == 1, 5, "status ready 1")
    loop.scale_kcm(2)
    wait_for(lambda: loop.kcm.ready() == 2, 30, "2 KCMs healthy", every_s=0.2)
    wait_for(lambda: loop.seed_admin.get(path)["status"].get("readyReplicas") == 2, 5, "status ready 2")
