"""Server-side apply of YAML documents, the way `kubectl apply --server-side` sends them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from testenv.client import Client

# kind -> (plural, namespaced); enough for this project's manifests.
RESOURCES: dict[str, tuple[str, bool]] = {
    "Namespace": ("namespaces", False),
    "ServiceAccount": ("serviceaccounts", True),
    "Secret": ("secrets", True),
    "ConfigMap": ("configmaps", True),
    "Service": ("services", True),
    "Node": ("nodes", False),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "DaemonSet": ("daemonsets", True),
    "Deployment": ("deployments", True),
    "PodDisruptionBudget": ("poddisruptionbudgets", True),
    "Lease": ("leases", True),
    "ValidatingAdmissionPolicy": ("validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": ("validatingadmissionpolicybindings", False),
    "FlowSchema": ("flowschemas", False),
    "PriorityLevelConfiguration": ("prioritylevelconfigurations", False),
    "CustomResourceDefinition": ("customresourcedefinitions", False),
}


def object_path(doc: dict[str, Any]) -> str:
    kind = doc["kind"]
    if kind not in RESOURCES:
        raise ValueError(f"testenv.apply does not know kind {kind}")
    plural, namespaced = RESOURCES[kind]
    api = doc["apiVersion"]
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    meta = doc["metadata"]
    ns = f"/namespaces/{meta.get('namespace', 'default')}" if namespaced else ""
    return f"{base}{ns}/{plural}/{meta['name']}"


def load_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def apply(
    client: Client, docs: Iterable[dict[str, Any]], manager: str = "dwd-lease-tests"
) -> list[dict[str, Any]]:
    out = []
    for doc in docs:
        out.append(
            client.request(
                "PATCH",
                object_path(doc),
                doc,
                content_type="application/apply-patch+yaml",
                params={"fieldManager": manager, "force": "true"},
            )
        )
    return out
