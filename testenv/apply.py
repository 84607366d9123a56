"""Server-side apply of YAML documents, the way `kubectl apply --server-side` sends them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from testenv import binaries
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
        if client.warnings:
            raise ApplyWarning(f"{doc['kind']}/{doc['metadata']['name']}: {client.warnings}")
    return out


class ApplyWarning(Exception):
    """The API server accepted an object but warned about it (unknown field, deprecation)."""


def kustomize_build(directory: str | Path) -> list[dict[str, Any]]:
    """Render a kustomization with the pinned kustomize from the Go module proxy."""
    kustomize = binaries.find()["kustomize"]
    out = subprocess.run(
        [str(kustomize), "build", str(directory)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"kustomize build {directory} failed: {out.stderr.strip()}")
    return load_docs(out.stdout)
