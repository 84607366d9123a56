"""The server and the CA of the node's kubelet kubeconfig: the agent proves kubelet's path.

KCM marks a node Unknown when its kubelet stops reaching KAPI, and kubelet reaches it
through the server of its own kubeconfig (in Gardener ``https://api.<internal domain>``,
which need not be the shoot's external domain). An agent that renews through any other
name proves a path that KCM does not judge. So by default the agent reads that file: the
``server`` and the CA of its current context, nothing else.

The file is mounted from the host. A kubeconfig that embeds a credential (a client key, a
token, a password) must not be mounted into a pod at all, so such a file is refused with an
error that says so, even though the agent would never use the credential: the mount is the
leak. Paths to a client certificate and key are fine; the agent does not read them.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from core.errors import unreadable

# Keys of a kubeconfig user that carry a secret in the file itself.
EMBEDDED_CREDENTIALS = ("client-key-data", "token", "password")


class KubeconfigError(ValueError):
    """The kubelet kubeconfig cannot be used; the message says why, naming the file."""


@dataclass(frozen=True)
class Endpoint:
    """Where kubelet reaches KAPI, and what verifies it."""

    server: str
    # PEM from certificate-authority-data, or a file named by certificate-authority (resolved
    # against the kubeconfig's directory, as kubectl does); neither: the system store.
    ca_pem: str = ""
    ca_file: str = ""


def read_endpoint(path: str) -> Endpoint:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise KubeconfigError(f"{path}: {unreadable(e)}") from None
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise KubeconfigError(f"{path}: {unreadable(e)}") from None
    if not isinstance(doc, Mapping):
        raise KubeconfigError(f"{path}: not a kubeconfig (no mapping at the top)")
    embedded = _embedded_credentials(path, doc)
    if embedded:
        raise KubeconfigError(
            f"{path} embeds credentials ({', '.join(embedded)}): such a file must not be mounted "
            "into the agent; set DWD_APISERVER_URL and DWD_CA_FILE instead (docs/install.md)"
        )
    cluster = _current_cluster(path, doc)
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeconfigError(f"{path}: the current cluster has no server")
    data = cluster.get("certificate-authority-data")
    if isinstance(data, str) and data:
        try:
            pem = base64.b64decode(data, validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError):
            raise KubeconfigError(f"{path}: certificate-authority-data is not base64 of a PEM") from None
        if "-----BEGIN CERTIFICATE-----" not in pem:
            raise KubeconfigError(f"{path}: certificate-authority-data holds no PEM certificate")
        return Endpoint(server.rstrip("/"), ca_pem=pem)
    ca = cluster.get("certificate-authority")
    if isinstance(ca, str) and ca:
        return Endpoint(server.rstrip("/"), ca_file=os.path.join(os.path.dirname(path), ca))
    return Endpoint(server.rstrip("/"))


def _embedded_credentials(path: str, doc: Mapping[str, Any]) -> list[str]:
    """Every user's embedded secret, as ``users[<name>].<key>``: any of them in the file is the
    leak, whichever user the current context names."""
    found = []
    for entry in _named(path, doc, "users"):
        user = entry.get("user")
        if isinstance(user, Mapping):
            found += [f"users[{entry.get('name')}].{k}" for k in EMBEDDED_CREDENTIALS if user.get(k)]
    return found


def _current_cluster(path: str, doc: Mapping[str, Any]) -> Mapping[str, Any]:
    clusters = {e.get("name"): e.get("cluster") for e in _named(path, doc, "clusters")}
    current = doc.get("current-context")
    if current:
        contexts = {e.get("name"): e.get("context") for e in _named(path, doc, "contexts")}
        context = contexts.get(current)
        if not isinstance(context, Mapping):
            raise KubeconfigError(f"{path}: current-context {current!r} is not among its contexts")
        name = context.get("cluster")
    elif len(clusters) == 1:
        (name,) = clusters
    else:
        raise KubeconfigError(f"{path}: no current-context, and {len(clusters)} clusters to choose from")
    cluster = clusters.get(name)
    if not isinstance(cluster, Mapping):
        raise KubeconfigError(f"{path}: cluster {name!r} of the current context is not in the file")
    return cluster


def _named(path: str, doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    entries = doc.get(key) or []
    if not isinstance(entries, list):
        raise KubeconfigError(f"{path}: {key} is not a list")
    return [e for e in entries if isinstance(e, Mapping)]
