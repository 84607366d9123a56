"""The server and the CA of the node's kubelet kubeconfig: the agent proves kubelet's path.

KCM marks a node Unknown when its kubelet stops reaching KAPI, and kubelet reaches it
through the server of its own kubeconfig (in Gardener ``https://api.<internal domain>``,
which need not be the shoot's external domain). An agent that renews through any other
name proves a path that KCM does not judge. So by default the agent reads that file: the
``server``, the CA and the ``tls-server-name`` of its current context, nothing else, as
client-go reads them (docs/agent.md). A cluster reached in a way the agent cannot take (without
verification, through a proxy, under a path) is refused by name.

The file is mounted from the host. A kubeconfig that embeds a credential (a client key, a
token, a password) must not be mounted into a pod at all, so such a file is refused with an
error that says so, even though the agent would never use the credential: the mount is the
leak. Paths to a client certificate and key are fine; the agent does not read them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core import kubeconfig
from core.errors import KubeconfigError

__all__ = ["Endpoint", "KubeconfigError", "read_endpoint"]


@dataclass(frozen=True)
class Endpoint:
    """Where kubelet reaches KAPI, and what verifies it."""

    server: str
    # PEM from certificate-authority-data, or a file named by certificate-authority (resolved
    # against the kubeconfig's directory, as kubectl does); neither: the system store.
    ca_pem: str = ""
    ca_file: str = ""
    # tls-server-name: what kubelet sends as SNI and checks the certificate against, where it
    # reaches KAPI by another name or an address.
    server_name: str = ""


def read_endpoint(path: str) -> Endpoint:
    doc = kubeconfig.read_file(path)
    embedded = kubeconfig.embedded_credentials(doc, path)
    if embedded:
        raise KubeconfigError(
            f"{path} embeds credentials ({', '.join(embedded)}): such a file must not be mounted "
            "into the agent; set DWD_APISERVER_URL and DWD_CA_FILE instead (docs/install.md)"
        )
    context = kubeconfig.current(doc, path, os.path.dirname(path))
    server, pem = context.server, context.ca_pem()
    if why := _not_kubelets_path(context.cluster, server):
        raise KubeconfigError(
            f"{path}: {why}; set DWD_APISERVER_URL (and DWD_CA_FILE) instead (docs/agent.md)"
        )
    ca_file = "" if pem else context.ca_file()
    return Endpoint(server, ca_pem=pem, ca_file=ca_file, server_name=context.server_name)


def _not_kubelets_path(cluster: Mapping[str, Any], server: str) -> str:
    """Why the agent cannot take the path kubelet takes to this cluster as client-go would ("" if
    it can): the agent verifies KAPI before it sends its token, dials it directly, and renews
    at the API's own paths."""
    if cluster.get("insecure-skip-tls-verify"):
        return "insecure-skip-tls-verify is set: the agent verifies KAPI before it sends its token"
    if cluster.get("proxy-url"):
        return "proxy-url is set: the agent connects to KAPI directly, never through a proxy"
    if server.partition("://")[2].partition("/")[2]:
        return f"server {server!r} has a path: the agent renews at the API's own paths"
    return ""
