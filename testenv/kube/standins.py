"""Stand-ins for what a test control plane lacks: agents that renew leases, a deployment controller.

Used by the integration tests, the demo and the benchmarks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from core.errors import Conflict, KubeError, NotFound
from core.lease import DEFAULT_LEASE_NAMESPACE, format_micro_time, leases_path, node_lease_path
from testenv.base.kapi import Client
from testenv.base.poller import Poller
from testenv.kube.controlplane import ensure_namespace
from testenv.kube.kubelet_identity import LEASE_DURATION_S, NODE_LEASE_NAMESPACE

AGENT_SA = "dwd-lease-agent"

DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"


def deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": name}]},
            },
        },
    }


# Where an agent's lease is: ours, in the lease namespace.
OUR_LEASE = functools.partial(node_lease_path, DEFAULT_LEASE_NAMESPACE)


class LeaseDriver(Poller):
    """Renews the leases of the nodes in ``alive``, as their agents would (``path``: where a
    node's lease is; the old layout's agents renewed another one)."""

    def __init__(
        self,
        client: Client,
        nodes: list[str],
        every_s: float = 0.5,
        path: Callable[[str], str] = OUR_LEASE,
    ) -> None:
        super().__init__("lease-driver", every_s)
        self.client = client
        self.alive = set(nodes)
        self.path = path

    def close(self) -> None:
        self.client.close()

    def step(self) -> None:
        now = format_micro_time(datetime.now(UTC))
        for node in sorted(self.alive):
            with contextlib.suppress(NotFound):
                self.client.merge_patch(self.path(node), {"spec": {"holderIdentity": node, "renewTime": now}})


class NodeLeaseDriver(Poller):
    """Renews ``kube-node-lease/<node>`` for the nodes in ``alive``, as kubelet does: created with
    ``renewTime`` set and ``leaseDurationSeconds`` 40 when missing, then merge-patched ``renewTime``.

    The leases DWD (and KCM) judge. One node's failed write does not hold up the others.
    """

    def __init__(
        self, client: Client, nodes: list[str], every_s: float = 1.0, lease_duration_s: int = LEASE_DURATION_S
    ) -> None:
        super().__init__("node-lease-driver", every_s)
        self.client = client
        # What the leases say of their renewals: kubelet renews every quarter of it, and the
        # aggregator's second witness expects a renewal that often (aggregator/decide/witness.py).
        self.lease_duration_s = lease_duration_s
        self.alive = set(nodes)
        self._created: set[str] = set()

    def close(self) -> None:
        self.client.close()

    def step(self) -> None:
        now = format_micro_time(datetime.now(UTC))
        for node in sorted(self.alive):
            with contextlib.suppress(KubeError, OSError, httpx.HTTPError):
                self._renew(node, now)

    def _renew(self, node: str, now: str) -> None:
        path = leases_path(NODE_LEASE_NAMESPACE)
        if node not in self._created:
            spec = {"holderIdentity": node, "leaseDurationSeconds": self.lease_duration_s, "renewTime": now}
            try:
                self.client.create(path, {"metadata": {"name": node}, "spec": spec})
            except Conflict:
                self.client.merge_patch(f"{path}/{node}", {"spec": {"renewTime": now}})
            self._created.add(node)
            return
        try:
            self.client.merge_patch(f"{path}/{node}", {"spec": {"renewTime": now}})
        except NotFound:
            self._created.discard(node)  # deleted under it: created again on the next step
            raise


class DeploymentController(Poller):
    """Plays the deployment controller the test control plane lacks: status follows spec."""

    def __init__(self, client: Client, namespace: str) -> None:
        super().__init__("deployment-controller", 0.2)
        self.client = client
        self.namespace = namespace

    def close(self) -> None:
        self.client.close()

    def step(self) -> None:
        for d in self.client.get(DEPLOYMENTS.format(ns=self.namespace))["items"]:
            self.copy_status(d)

    def copy_status(self, d: dict[str, Any]) -> None:
        if not status_follows(d):
            follow_spec(self.client, d)


def status_follows(d: dict[str, Any]) -> bool:
    """Whether a Deployment's status already shows every wanted replica ready."""
    want = d["spec"].get("replicas", 1)
    status = d.get("status") or {}
    return bool(status.get("replicas", 0) == want and status.get("readyReplicas", 0) == want)


def follow_spec(client: Client, d: dict[str, Any]) -> None:
    """Status follows spec at once: every replica is ready the moment it is wanted."""
    meta, want = d["metadata"], d["spec"].get("replicas", 1)
    client.merge_patch(
        f"{DEPLOYMENTS.format(ns=meta['namespace'])}/{meta['name']}/status",
        {
            "status": {
                "observedGeneration": meta.get("generation", 1),
                "replicas": want,
                "readyReplicas": want,
                "availableReplicas": want,
                "updatedReplicas": want,
            }
        },
    )


def grant_agent_rbac(c: Client, namespace: str = DEFAULT_LEASE_NAMESPACE) -> None:
    """What the shoot manifests grant the agent: patch leases in the lease namespace, nothing else."""
    ensure_namespace(c, namespace)
    c.ensure(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": AGENT_SA}})
    c.ensure(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {
            "metadata": {"name": AGENT_SA},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["patch"]}],
        },
    )
    c.ensure(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": AGENT_SA},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AGENT_SA},
            "subjects": [{"kind": "ServiceAccount", "name": AGENT_SA, "namespace": namespace}],
        },
    )
