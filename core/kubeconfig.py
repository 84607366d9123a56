"""The one reader of data-only kubeconfigs: the agent's (the kubelet's file, for its server
and CA) and every kubeconfig the aggregator takes from a Secret (credentials as data).

It resolves the current context to its cluster and user entries, decodes the CA, and refuses
what it does not understand by name; it never runs a command, reads a file the kubeconfig
names (but the agent's CA path, resolved as kubectl does), or follows a proxy. The
``kubernetes`` package's loader is kept for the one kubeconfig that may legitimately run a
plugin: the aggregator's own, outside a cluster (aggregator/kube/endpoint.py)."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from core.errors import KubeconfigError, unreadable

# Keys of a user that carry a secret in the file itself.
EMBEDDED_CREDENTIALS = ("client-key-data", "token", "password")


@dataclass(frozen=True)
class Context:
    """The current context's cluster and user entries (empty mappings where absent)."""

    source: str
    cluster: Mapping[str, Any]
    user: Mapping[str, Any]
    directory: str = ""

    @property
    def server(self) -> str:
        server = self.cluster.get("server")
        if not isinstance(server, str) or not server:
            raise KubeconfigError(f"{self.source}: the current cluster has no server")
        return server.rstrip("/")

    @property
    def server_name(self) -> str:
        """``tls-server-name``: the name to send as SNI and to check the server's certificate
        against where it is not the server's host; "" without one."""
        name = self.cluster.get("tls-server-name")
        return name if isinstance(name, str) else ""

    def ca_pem(self) -> str:
        """The PEM of ``certificate-authority-data``; "" without one."""
        data = self.cluster.get("certificate-authority-data")
        if not isinstance(data, str) or not data:
            return ""
        if self.cluster.get("certificate-authority"):
            # client-go refuses the file too: it would not know which CA its writer meant.
            raise KubeconfigError(
                f"{self.source}: the current cluster has both certificate-authority-data and "
                "certificate-authority"
            )
        return pem(data, self.source, "certificate-authority-data", "CERTIFICATE")

    def ca_file(self) -> str:
        """``certificate-authority``, resolved against the kubeconfig's directory as kubectl
        does; "" without one."""
        ca = self.cluster.get("certificate-authority")
        return os.path.join(self.directory, ca) if isinstance(ca, str) and ca else ""


def pem(data: str, source: str, field: str, kind: str) -> str:
    """A base64 field that must hold a PEM block of ``kind``, decoded."""
    try:
        text = decode_base64(data).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        raise KubeconfigError(f"{source}: {field} is not base64 of a PEM") from None
    # A key's block names its algorithm or not (EC PRIVATE KEY, PRIVATE KEY): the end is the same.
    marker = "PRIVATE KEY-----" if kind == "PRIVATE KEY" else f"-----BEGIN {kind}-----"
    if marker not in text:
        raise KubeconfigError(f"{source}: {field} holds no PEM {kind.lower()}")
    return text


def decode_base64(data: str) -> bytes:
    """Base64 as client-go decodes a kubeconfig's ``*-data`` (Go's ``base64.StdEncoding``, through
    encoding/json): CR and LF are skipped wherever they are (``base64`` wraps at 76 columns), the
    padding is required, anything else outside the alphabet is an error."""
    return base64.b64decode(data.replace("\r", "").replace("\n", ""), validate=True)


def read_file(path: str) -> Mapping[str, Any]:
    """A kubeconfig file, parsed; errors name the file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise KubeconfigError(f"{path}: {unreadable(e)}") from None
    return parse(text, path)


def parse(text: str | bytes, source: str) -> Mapping[str, Any]:
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise KubeconfigError(f"{source}: {unreadable(e)}") from None
    if not isinstance(doc, Mapping):
        raise KubeconfigError(f"{source}: not a kubeconfig (no mapping at the top)")
    return doc


def current(doc: Mapping[str, Any], source: str, directory: str = "") -> Context:
    """The current context's cluster and user; a user the file lacks is an empty one."""
    clusters = {e.get("name"): e.get("cluster") for e in named(doc, "clusters", source)}
    users = {e.get("name"): e.get("user") for e in named(doc, "users", source)}
    name = doc.get("current-context")
    if not name:
        # client-go then reads no cluster at all ("no configuration has been provided").
        raise KubeconfigError(f"{source}: no current-context")
    contexts = {e.get("name"): e.get("context") for e in named(doc, "contexts", source)}
    context = contexts.get(name)
    if not isinstance(context, Mapping):
        raise KubeconfigError(f"{source}: current-context {name!r} is not among its contexts")
    cluster_name, user_name = context.get("cluster"), context.get("user")
    cluster = clusters.get(cluster_name)
    if not isinstance(cluster, Mapping):
        raise KubeconfigError(f"{source}: cluster {cluster_name!r} of the current context is not in the file")
    # A user the file lacks is no user: a reader that needs one says what it lacks.
    user = users.get(user_name)
    return Context(source, cluster, user if isinstance(user, Mapping) else {}, directory)


def embedded_credentials(doc: Mapping[str, Any], source: str) -> list[str]:
    """Every user's embedded secret, as ``users[<name>].<key>``: whichever user the current
    context names, any of them in the file is in the file."""
    found = []
    for entry in named(doc, "users", source):
        user = entry.get("user")
        if isinstance(user, Mapping):
            found += [f"users[{entry.get('name')}].{k}" for k in EMBEDDED_CREDENTIALS if user.get(k)]
    return found


def only_data(
    doc: Mapping[str, Any], source: str, user_fields: frozenset[str], cluster_fields: frozenset[str]
) -> None:
    """Every user and cluster holds only the fields named (not only the current context's:
    what it does not use, it has no reason to carry); the first other is refused by name."""
    for section, key, allowed in (("users", "user", user_fields), ("clusters", "cluster", cluster_fields)):
        for entry in named(doc, section, source):
            body = entry.get(key)
            if isinstance(body, Mapping) and (refused := sorted(set(body) - allowed)):
                raise KubeconfigError(
                    f"{source}: {key} {entry.get('name')!r} has {refused[0]!r}, not allowed "
                    f"in a kubeconfig from a Secret (it may hold {', '.join(sorted(allowed))}: "
                    "credentials as data, never a command, a local file or a proxy)"
                )


def named(doc: Mapping[str, Any], key: str, source: str) -> list[Mapping[str, Any]]:
    entries = doc.get(key) or []
    if not isinstance(entries, list):
        raise KubeconfigError(f"{source}: {key} is not a list")
    return [e for e in entries if isinstance(e, Mapping)]
