"""Gardener's objects in a test seed: the Cluster CRD (schemaless) and Cluster objects of a
realistic size. A Cluster embeds its Shoot, Seed and CloudProfile; in a real seed one is
about 25 KB, most of it the CloudProfile's machine images and types."""

from __future__ import annotations

from typing import Any

CLUSTER_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clusters.extensions.gardener.cloud"},
    "spec": {
        "group": "extensions.gardener.cloud",
        "scope": "Cluster",
        "names": {"plural": "clusters", "singular": "cluster", "kind": "Cluster", "listKind": "ClusterList"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


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
