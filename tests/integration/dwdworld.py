"""A shoot for tests beside dependency-watchdog: kubelet leases renewed (``NodeLeaseDriver``) and
the prober stand-in of testenv/gardener/prober_standin.py with clients of its own, on short clocks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from core.lease import leases_path
from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.gardener.prober_standin import NODE_LEASE_NAMESPACE, ProberStandIn
from testenv.kube.standins import DEPLOYMENTS, NodeLeaseDriver
from testenv.worlds.shoot_world import FAST_DEPENDENTS, Shoot

NODES = [f"node-{i}" for i in range(10)]
# Short clocks, DWD's rules: a lease is expired 1.5 s after its renewal.
FAST: dict[str, Any] = {
    "dependents": FAST_DEPENDENTS,
    "kcm_grace_s": 2.0,
    "probe_interval_s": 0.3,
    "jitter": 0.2,
    "initial_delay_s": 0.0,
    "probe_timeout_s": 5.0,
}


@dataclass
class DwdWorld:
    shoot: Shoot
    kubelets: NodeLeaseDriver
    dwd: ProberStandIn

    def cut(self, nodes: set[str]) -> None:
        """The path breaks for ``nodes``: their kubelets and their agents stop renewing."""
        self.kubelets.alive -= nodes
        self.shoot.driver.alive -= nodes

    def heal(self) -> None:
        self.kubelets.alive |= set(NODES)
        self.shoot.driver.alive |= set(NODES)


@contextlib.contextmanager
def dwd_worlds(shoot: Shoot) -> Iterator[Callable[..., DwdWorld]]:
    """A shoot with 10 nodes whose kubelet leases renew every 0.3 s, and a DWD stand-in with
    clients of its own (not yet started)."""
    clients: list[Client] = []
    worlds: list[DwdWorld] = []

    def make(
        controllers: dict[str, int] | None = None,
        annotations: dict[str, dict[str, str]] | None = None,
        **settings: Any,
    ) -> DwdWorld:
        shoot.setup(controllers=controllers)
        for name, marks in (annotations or {}).items():
            shoot.seed_admin.merge_patch(
                f"{DEPLOYMENTS.format(ns=shoot.namespace)}/{name}", {"metadata": {"annotations": marks}}
            )
        # Renewed every 0.3 s, the leases say so (2 s: a renewal due every 0.5 s), as kubelet's 40 s say 10.
        kubelets = NodeLeaseDriver(shoot.shoot.admin_client(), NODES, every_s=0.3, lease_duration_s=2)
        kubelets.start()
        clients.extend([shoot.shoot.admin_client(), shoot.seed.admin_client()])
        dwd = ProberStandIn(clients[-2], clients[-1], shoot.namespace, **{**FAST, **settings})
        world = DwdWorld(shoot, kubelets, dwd)
        worlds.append(world)
        wait_for(lambda: len(renewed(shoot)) == len(NODES), 10, "every kubelet lease renewed")
        return world

    try:
        yield make
    finally:
        for w in worlds:
            w.dwd.stop()
            w.kubelets.stop()
        for c in clients:
            c.close()


def renewed(shoot: Shoot) -> list[str]:
    items = shoot.shoot_admin.get(leases_path(NODE_LEASE_NAMESPACE))["items"]
    return [x["metadata"]["name"] for x in items if x["spec"].get("renewTime")]
