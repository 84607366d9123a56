"""A workload for KCM to act on, and a reading of what KCM did to it.

One pod bound to each node (``spec.nodeName`` set: no scheduler runs in tests) carrying a label,
and a Service selecting them: KCM's EndpointSlice controller lists a ready endpoint per ready
pod, and takes one away when the node lifecycle controller marks the pod's node Unknown and the
pod NotReady. ``observe`` reads nodes, pods and the Service's ready endpoints in one go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.kube.controlplane import ensure_namespace

NAMESPACE = "workload"
APP = "web"


def pod_name(node: str) -> str:
    return f"{APP}-{node}"


def deploy(c: Client, nodes: list[str], namespace: str = NAMESPACE, timeout_s: float = 120.0) -> None:
    """The Service, and a pod on each of ``nodes`` once its kubelet has reported what the node
    holds: a pod bound to a Node the test created before its kubelet first posted a status is
    refused for good (OutOfpods, "capacity: 0"), and that node's pod never turns Ready."""
    ensure_namespace(c, namespace)
    # The ServiceAccount admission plugin rejects pods until "default" exists; KCM's
    # serviceaccount controller would create it, but KCM may not be running yet.
    c.ensure(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "default"}})
    c.ensure(
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": APP},
            "spec": {"selector": {"app": APP}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    wait_for(lambda: not without_room(c, nodes), timeout_s, "every node's kubelet reporting room for pods")
    for node in nodes:
        c.ensure(
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "metadata": {"name": pod_name(node), "labels": {"app": APP}},
                "spec": {
                    "nodeName": node,
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "web", "image": "web", "ports": [{"containerPort": 8080}]}],
                },
            },
        )


def without_room(c: Client, nodes: list[str]) -> list[str]:
    """Those of ``nodes`` whose Node has no room for a pod (yet): allocatable pods missing or 0."""
    room = {
        n["metadata"]["name"]: int((n.get("status") or {}).get("allocatable", {}).get("pods", "0"))
        for n in c.get("/api/v1/nodes")["items"]
    }
    return [n for n in nodes if room.get(n, 0) < 1]


def _condition(obj: dict[str, Any], kind: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return "Missing"


@dataclass(frozen=True)
class Observation:
    nodes: dict[str, str]  # node -> its Ready condition's status: True, False, Unknown, Missing
    pods: dict[str, str]  # node -> its pod's Ready condition's status
    ready_endpoints: int  # ready endpoints over the Service's EndpointSlices

    def unknown(self) -> list[str]:
        return sorted(n for n, s in self.nodes.items() if s == "Unknown")

    def pods_not_ready(self) -> list[str]:
        return sorted(n for n, s in self.pods.items() if s != "True")


def observe(c: Client, namespace: str = NAMESPACE) -> Observation:
    nodes = {n["metadata"]["name"]: _condition(n, "Ready") for n in c.get("/api/v1/nodes")["items"]}
    pods = {
        p["spec"].get("nodeName", ""): _condition(p, "Ready")
        for p in c.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"app={APP}")["items"]
    }
    slices = c.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        labelSelector=f"kubernetes.io/service-name={APP}",
    )["items"]
    ready = sum(
        1
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready") is True
    )
    return Observation(nodes, pods, ready)
