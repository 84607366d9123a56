"""Gardener's objects in a test seed: its CRDs (``module_crds``: from Gardener's release;
schemaless ones where a test needs no GRM build), Extensions, and Cluster objects of a realistic
size. A Cluster embeds its Shoot, Seed and CloudProfile; in a real seed one is about 25 KB, most
of it the CloudProfile's machine images and types."""

from __future__ import annotations

from typing import Any

from testenv.gardener import grm
from testenv.gardener.apply import load_docs


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
CLUSTERS_PATH = "/apis/extensions.gardener.cloud/v1alpha1/clusters"
# MCM's Machine, as far as a reader of its phase needs it.
MACHINE_CRD = schemaless_crd("machine.sapcloud.io", "Machine", namespaced=True, status=True)


# The operations and states of a Shoot's ``status.lastOperation``, as Gardener names them
# (pkg/apis/core/v1beta1/types_common.go).
LAST_OPERATION_TYPES = ("Create", "Reconcile", "Delete", "Migrate", "Restore")
LAST_OPERATION_STATES = ("Processing", "Succeeded", "Error", "Failed", "Pending", "Aborted")
DELETED_AT = "2026-01-01T00:00:00Z"


def shoot(
    name: str = "s",
    *,
    project: str = "p",
    workers: int = 1,
    hibernation: bool | None = None,
    hibernated: bool = False,
    last_operation: tuple[str, str] | None = ("Reconcile", "Succeeded"),
    deleting: bool = False,
    node_conditions: dict[str, list[str]] | None = None,
    grace: str = "",
    force_deletion: str | None = None,
) -> dict[str, Any]:
    """A Shoot as gardenlet embeds it in a Cluster (``core.gardener.cloud/v1beta1``), with the
    fields dependency-watchdog and the aggregator read under their wire names:
    ``metadata.deletionTimestamp`` (``deleting``), ``spec.hibernation.enabled`` (``hibernation``,
    None: not set), ``status.hibernated``, ``spec.provider.workers`` (``workers`` pools, each
    ``pool``, ``pool-1``, ...; ``node_conditions`` gives a pool MCM settings with that list),
    ``status.lastOperation`` (type and state; None: absent), the shoot's KCM grace, and the
    force-deletion confirmation's value (None: not annotated)."""
    spec: dict[str, Any] = {
        "cloudProfileName": "local",
        "region": "local",
        "provider": {"type": "local", "workers": _workers(workers, node_conditions or {})},
        "kubernetes": {"version": "1.35.4"},
    }
    if hibernation is not None:
        spec["hibernation"] = {"enabled": hibernation}
    if grace:
        spec["kubernetes"]["kubeControllerManager"] = {"nodeMonitorGracePeriod": grace}
    status: dict[str, Any] = {"hibernated": hibernated}
    if last_operation is not None:
        kind, state = last_operation
        status["lastOperation"] = recorded_operation(kind, state, "2026-01-01T00:00:00Z")
    meta: dict[str, Any] = {"name": name, "namespace": f"garden-{project}"}
    if deleting:
        meta["deletionTimestamp"] = DELETED_AT
        meta["finalizers"] = ["gardener"]
    if force_deletion is not None:
        meta["annotations"] = {"confirmation.gardener.cloud/force-deletion": force_deletion}
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "Shoot",
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


def _workers(count: int, node_conditions: dict[str, list[str]]) -> list[dict[str, Any]]:
    """``count`` worker pools, ``pool``, ``pool-1``, ...; those named in ``node_conditions`` with
    MCM settings that list them."""
    pools = []
    for i in range(count):
        pool = f"pool-{i}" if i else "pool"
        worker: dict[str, Any] = {"name": pool, "minimum": 1, "maximum": 10, "machine": {"type": "m1.xlarge"}}
        if pool in node_conditions:
            worker["machineControllerManager"] = {"nodeConditions": node_conditions[pool]}
        pools.append(worker)
    return pools


def cluster(name: str, *, machine_types: int = 0, **shoot_fields: Any) -> dict[str, Any]:
    """A Cluster as gardenlet writes it for the control-plane namespace ``name``
    (``shoot--<project>--<shoot>``), embedding the Shoot (``shoot()``'s fields: by default
    reconciled, one worker pool), its Seed and CloudProfile. ``machine_types``: how many the
    CloudProfile offers (about 110 bytes each in JSON): ~200 make the 25 KB of a real one."""
    parts = name.split("--")
    project, shoot_name = (parts[1], parts[2]) if len(parts) == 3 else ("p", name)
    return {
        "apiVersion": "extensions.gardener.cloud/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {
            "cloudProfile": {
                "apiVersion": "core.gardener.cloud/v1beta1",
                "kind": "CloudProfile",
                "metadata": {"name": "local"},
                "spec": {
                    "type": "local",
                    "machineTypes": [
                        {"name": f"m{i}.xlarge", "cpu": "4", "gpu": "0", "memory": "16Gi", "usable": True}
                        for i in range(machine_types)
                    ],
                },
            },
            "seed": {
                "apiVersion": "core.gardener.cloud/v1beta1",
                "kind": "Seed",
                "metadata": {"name": "local"},
                "spec": {"provider": {"type": "local", "region": "local"}},
            },
            "shoot": shoot(shoot_name, project=project, **shoot_fields),
        },
    }


def module_crds(*kinds: str) -> list[dict[str, Any]]:
    """The CRDs of ``kinds`` as Gardener's release ships them for a seed (testenv/gardener/grm.py
    ``SEED_CRDS``: Cluster, Extension, ManagedResource, Machine, VerticalPodAutoscaler,
    PrometheusRule), read from its module tree, not written here: their schemas prune and
    reject what Gardener's would. Needs GRM's build (``pytest.mark.builds(grm.NAME)``)."""
    unknown = [kind for kind in kinds if kind not in grm.SEED_CRDS]
    if unknown:
        raise KeyError(f"no CRD of kind {unknown} taken from gardener's tree: one of {sorted(grm.SEED_CRDS)}")
    return [doc for kind in kinds for doc in load_docs(grm.find_crd(kind).read_text())]


EXTENSION_TYPE = "dwd-lease"
# gardenlet's annotations on an extension object (pkg/apis/core/v1beta1/constants).
OPERATION = "gardener.cloud/operation"
TIMESTAMP = "gardener.cloud/timestamp"


def extension(
    namespace: str,
    *,
    type_: str = EXTENSION_TYPE,
    provider_config: dict[str, Any] | None = None,
    timestamp: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    """An Extension as gardenlet creates it in a shoot's control-plane namespace
    (``pkg/component/extensions/extension/extension.go``): named after its type, the Shoot's
    ``providerConfig`` copied in, annotated to be reconciled."""
    spec: dict[str, Any] = {"type": type_}
    if provider_config is not None:
        spec["providerConfig"] = provider_config
    return {
        "apiVersion": "extensions.gardener.cloud/v1alpha1",
        "kind": "Extension",
        "metadata": {
            "name": type_,
            "namespace": namespace,
            "annotations": {OPERATION: "reconcile", TIMESTAMP: timestamp},
        },
        "spec": spec,
    }


def recorded_operation(kind: str, state: str, updated: str) -> dict[str, Any]:
    """A ``status.lastOperation`` as an extension controller writes it (``updated``: RFC 3339)."""
    return {
        "type": kind,
        "state": state,
        "progress": 100 if state == "Succeeded" else 50,
        "description": f"{kind} {state.lower()}",
        "lastUpdateTime": updated,
    }


def extension_status(
    state: str, updated: str, *, observed_generation: int = 1, kind: str = "Reconcile"
) -> dict[str, Any]:
    """An Extension's ``status`` as its controller writes it: the ``observedGeneration`` it
    answered and its ``lastOperation`` (``kind`` in ``state`` at ``updated``)."""
    return {
        "observedGeneration": observed_generation,
        "lastOperation": recorded_operation(kind, state, updated),
    }
