"""The shoot part as the extension delivers it into each shoot it serves: the objects of
manifests/gardener/shoot/objects.yaml (the agents' DaemonSet, RBAC, the aggregator's access) in a
ManagedResource without class, which the shoot's own gardener-resource-manager applies into the
shoot and keeps there, and the token-requestor Secret the aggregator reaches the shoot with.

As Gardener's ``managedresources.NewForShoot`` makes it for an extension: labelled with our own
``origin`` (gardenlet acts on ``origin: gardener`` alone; ours it leaves to our delete step) and
with ``shoot.gardener.cloud/no-cleanup`` injected into every object, so gardenlet's shoot
deletion does not clean them up behind the resource manager's back. The objects' Secret has one
name, written in place: a name with a hash would need the resource manager's garbage collector
and its reference annotation, for nothing a rewrite does not do.

Pure: the bodies; aggregator/extension/reconciler.py writes them.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from core.errors import ConfigError

MANAGED_RESOURCE = "dwd-lease-shoot"
OBJECTS_SECRET = "managedresource-dwd-lease-shoot"
OBJECTS_KEY = "objects.yaml"
ORIGIN = "dwd-lease"
NO_CLEANUP = "shoot.gardener.cloud/no-cleanup"
AGENT = "dwd-lease-agent"

MANAGED_RESOURCES = "/apis/resources.gardener.cloud/v1alpha1/namespaces/{ns}/managedresources"
SECRETS = "/api/v1/namespaces/{ns}/secrets"


def managed_resource_path(namespace: str) -> str:
    return MANAGED_RESOURCES.format(ns=namespace) + "/" + MANAGED_RESOURCE


def secret_path(namespace: str, name: str) -> str:
    return SECRETS.format(ns=namespace) + "/" + name


@dataclass(frozen=True)
class ShootPart:
    """What every served shoot gets: the objects as YAML, and the Secret the aggregator reads its
    credentials for the shoot from (DWD_KUBECONFIG_SECRET)."""

    objects: bytes
    access_secret: str

    @classmethod
    def load(cls, path: str, access_secret: str, agent_image: str = "") -> ShootPart:
        """The objects of ``path`` (DWD_SHOOT_OBJECTS), the agents' image replaced by
        ``agent_image`` where one is given (the chart's image vector). A file that is not a
        list of Kubernetes objects with a DaemonSet named dwd-lease-agent is refused, naming
        the file: delivering it would turn protection off in every shoot at once."""
        where = f"DWD_SHOOT_OBJECTS {path}"
        try:
            docs = [d for d in yaml.safe_load_all(Path(path).read_bytes()) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError([f"{where}: {e}"]) from e
        for i, doc in enumerate(docs):
            if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
                raise ConfigError([f"{where}: document {i} is not a Kubernetes object"])
            if not isinstance(doc.get("metadata"), dict) or not doc["metadata"].get("name"):
                raise ConfigError([f"{where}: document {i} ({doc['kind']}) has no metadata.name"])
        agents = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == AGENT]
        if len(agents) != 1:
            raise ConfigError([f"{where}: {len(agents)} DaemonSets named {AGENT}, not one"])
        if agent_image:
            containers = agents[0].get("spec", {}).get("template", {}).get("spec", {}).get("containers")
            if not isinstance(containers, list) or not containers:
                raise ConfigError([f"{where}: the DaemonSet {AGENT} has no containers"])
            for container in containers:
                container["image"] = agent_image
        return cls(yaml.safe_dump_all(docs, sort_keys=False).encode(), access_secret)


def objects_secret(namespace: str, part: ShootPart) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": OBJECTS_SECRET, "namespace": namespace, "labels": {"origin": ORIGIN}},
        "type": "Opaque",
        "data": {OBJECTS_KEY: base64.b64encode(part.objects).decode()},
    }


def access_secret(namespace: str, part: ShootPart) -> dict[str, Any]:
    """The token requestor's Secret: the shoot's resource manager writes a token of
    kube-system/dwd-lease-aggregator (its RBAC among the objects) and the shoot's CA into it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": part.access_secret,
            "namespace": namespace,
            "labels": {
                "origin": ORIGIN,
                "resources.gardener.cloud/purpose": "token-requestor",
                "resources.gardener.cloud/class": "shoot",
            },
            "annotations": {
                "serviceaccount.resources.gardener.cloud/name": "dwd-lease-aggregator",
                "serviceaccount.resources.gardener.cloud/namespace": "kube-system",
                "serviceaccount.resources.gardener.cloud/inject-ca-bundle": "true",
            },
        },
        "type": "Opaque",
    }


def managed_resource(namespace: str, *, keep_objects: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "resources.gardener.cloud/v1alpha1",
        "kind": "ManagedResource",
        "metadata": {"name": MANAGED_RESOURCE, "namespace": namespace, "labels": {"origin": ORIGIN}},
        "spec": {
            "secretRefs": [{"name": OBJECTS_SECRET}],
            "injectLabels": {NO_CLEANUP: "true"},
            "keepObjects": keep_objects,
        },
    }
