"""Gardener's objects in a test seed: the Cluster and Machine CRDs (schemaless) and Cluster
objects of a realistic size. A Cluster embeds its Shoot, Seed and CloudProfile; in a real seed one is
about 25 KB, most of it the CloudProfile's machine images and types."""

from __future__ import annotations

from typing import Any


def _approval(group: str) -> dict[str, str]:
    """The annotation a CRD in a Kubernetes-owned group needs (VPA's carries the same)."""
    if group == "k8s.io" or group.endswith((".k8s.io", ".kubernetes.io")):
        return {"api-approved.kubernetes.io": "https://github.com/kubernetes/kubernetes/pull/63797"}
    return {}


def schemaless_crd(
    group: str, kind: str, *, namespaced: bool, status: bool = False, version_name: str = "v1alpha1"
) -> dict[str, Any]:
    """A CRD that accepts any object of its kind: the tests read a few fields of Gardener's
    and MCM's objects, and a schema would only repeat theirs."""
    plural = kind.lower() + "s"
    version: dict[str, Any] = {
        "name": version_name,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "annotations": _approval(group)},
        "spec": {
            "group": group,
            "scope": "Namespaced" if namespaced else "Cluster",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [version],
        },
    }


CLUSTER_CRD = schemaless_crd("extensions.gardener.cloud", "Cluster", namespaced=False)
# MCM's Machine, as far as a reader of its phase needs it.
MACHINE_CRD = schemaless_crd("machine.sapcloud.io", "Machine", namespaced=True, status=True)
# What the Gardener manifests (manifests/gardener) are made of beside core kinds: applied as
# the API server would store them, not checked against the real schemas.
GARDENER_MANIFEST_CRDS = [
    schemaless_crd("resources.gardener.cloud", "ManagedResource", namespaced=True),
    schemaless_crd("autoscaling.k8s.io", "VerticalPodAutoscaler", namespaced=True, version_name="v1"),
    schemaless_crd("monitoring.coreos.com", "PrometheusRule", namespaced=True, version_name="v1"),
]


def cluster(name: str, *, machine_types: int = 0) -> dict[str, Any]:
    """A reconciled Cluster with one worker pool. ``machine_types``: how many the embedded
    CloudProfile offers (about 110 bytes each in JSON): ~200 make the 25 KB of a real one."""
    return {
        "apiVersion": "extensions.gardener.cloud/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {
            "cloudProfile": {
                "spec": {
                    "machineTypes": [
                        {"name": f"m{i}.xlarge", "cpu": "4", "gpu": "0", "memory": "16Gi", "usable": True}
                        for i in range(machine_types)
                    ]
                }
            },
            "seed": {"spec": {"provider": {"type": "local", "region": "local"}}},
            "shoot": {
                "spec": {"provider": {"workers": [{"name": "pool", "minimum": 1, "maximum": 10}]}},
                "status": {"lastOperation": {"type": "Reconcile", "state": "Succeeded"}},
            },
        },
    }
