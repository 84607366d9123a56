"""The agent's configuration, from the environment (docs/agent.md)."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.kubeconfig import Endpoint, KubeconfigError, read_endpoint
from agent.origin import Origin, ssl_context
from core.config import EnvReader, read_vars, var
from core.credentials import DEFAULT_TOKEN_FILE
from core.lease import (
    DEFAULT_LEASE_NAMESPACE,
    LEGACY_LEASE_NAMESPACE,
    MAX_NODE_NAME,
    is_dns_label,
    is_dns_subdomain,
    renew_interval_var,
)
from core.logs import LogFormat

# Settings of earlier releases (core/config.py EnvReader), warned about: failing on them would
# stop the agent on every node at once during an upgrade, which looks exactly like an outage.
# Each is kept for one release after the one that changed it (CHANGELOG.md says which).
RENAMED: dict[str, str] = {}
RETIRED = {
    "DWD_REQUEST_TIMEOUT": "a renewal may now take twice the interval, at most 10s (docs/agent.md)",
}

# Gardener's kubelet kubeconfig on a worker node; the DaemonSet mounts it at the same path.
DEFAULT_KUBELET_KUBECONFIG = "/var/lib/kubelet/kubeconfig-real"
# Where the server comes from when DWD_APISERVER_URL is empty: the kubelet's kubeconfig (root
# and a hostPath: kubelet writes it 0600), or the name Gardener gives every pod of a shoot.
SOURCES = ("kubelet-kubeconfig", "kubernetes-service-host")


@dataclass(frozen=True)
class Settings:
    apiserver_url: str
    node_name: str
    lease_namespace: str = var("DWD_LEASE_NAMESPACE", DEFAULT_LEASE_NAMESPACE, "string")
    legacy_namespace: str = var("DWD_LEGACY_LEASE_NAMESPACE", LEGACY_LEASE_NAMESPACE, "string")
    """During a move from the old layout, the node's lease there is renewed too, until it is gone
    or refused; ``-``: never."""
    renew_interval_s: float = renew_interval_var()
    """Until the aggregator's renew-interval annotation says otherwise: the aggregator's fast
    interval (the same variable on its side), so a node renews as it is judged from its first
    renewal; the aggregator's lease duration is at least twice it."""
    token_file: str = var("DWD_TOKEN_FILE", DEFAULT_TOKEN_FILE, "string")
    ca_file: str = ""
    # The CA as read from the kubelet kubeconfig's certificate-authority-data.
    ca_pem: str = ""
    # The kubelet kubeconfig's tls-server-name: the certificate is checked against it, and it
    # goes as SNI ("": the server's host).
    server_name: str = ""
    # The kubelet kubeconfig that gave the server ("" when DWD_APISERVER_URL did): read
    # again for its CA after a TLS failure, since a CA rotation rewrites it.
    kubelet_kubeconfig: str = ""
    # What gave the server: DWD_APISERVER_URL, the kubeconfig's path or KUBERNETES_SERVICE_HOST.
    server_from: str = "DWD_APISERVER_URL"
    metrics_addr: tuple[str, int] | None = None
    log_format: LogFormat = "auto"
    log_level: str = "info"
    # DWD_ variables set that the agent does not know: warned about and counted, not fatal
    # (an agent rolled back under newer manifests must not crash-loop on every node).
    unknown: tuple[str, ...] = ()
    # Settings of the release before that are set (RENAMED, RETIRED): warned about at start.
    deprecated: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        r = EnvReader(env, renamed=RENAMED, retired=RETIRED)
        settings = cls.read(r)
        r.finish()
        return replace(settings, unknown=tuple(r.unknown()), deprecated=tuple(r.deprecated()))

    @classmethod
    def read(cls, r: EnvReader) -> Settings:
        endpoint, kubeconfig, server_from = _endpoint(r)
        node = r.string("NODE_NAME", required=True)
        if node and not is_dns_subdomain(node):
            r.problem("NODE_NAME", f"{node!r} is not a valid node name (RFC 1123 subdomain)")
        elif len(node) > MAX_NODE_NAME:
            r.problem(
                "NODE_NAME", f"{node[:40]}... has {len(node)} characters; a lease name holds {MAX_NODE_NAME}"
            )
        values = read_vars(r, cls)
        if not is_dns_label(namespace := values["lease_namespace"]):
            r.problem("DWD_LEASE_NAMESPACE", f"{namespace!r} is not a valid namespace name")
        if values["legacy_namespace"] == "-":  # off (an empty variable is the default)
            values["legacy_namespace"] = ""
        if (legacy := values["legacy_namespace"]) and not is_dns_label(legacy):
            r.problem("DWD_LEGACY_LEASE_NAMESPACE", f"{legacy!r} is not a valid namespace name")
        if not os.access(token_file := values["token_file"], os.R_OK):
            r.problem("DWD_TOKEN_FILE", f"{token_file} is not a readable file")
        ca_file = _ca_file(r, endpoint, kubeconfig)
        metrics = r.address("DWD_METRICS_ADDR")
        log_format, log_level = r.logging()
        return cls(
            apiserver_url=endpoint.server,
            node_name=node,
            **values,
            ca_file=ca_file,
            ca_pem="" if ca_file else endpoint.ca_pem,
            server_name=endpoint.server_name,
            kubelet_kubeconfig=kubeconfig,
            server_from=server_from,
            metrics_addr=metrics,
            log_format=log_format,
            log_level=log_level,
        )

    def tls(self) -> ssl.SSLContext:
        """The context that verifies KAPI, read afresh (the renewer calls it again after a TLS
        failure: the CA may have been rotated). A kubelet kubeconfig that cannot be read at
        that moment (rewritten in place) leaves the CA read at start."""
        if self.ca_file or not self.ca_pem:
            return ssl_context(self.ca_file)
        pem = self.ca_pem
        if self.kubelet_kubeconfig:
            with contextlib.suppress(KubeconfigError):
                pem = read_endpoint(self.kubelet_kubeconfig).ca_pem or pem
        return ssl_context(ca_pem=pem)


def _endpoint(r: EnvReader) -> tuple[Endpoint, str, str]:
    """The server (and the kubeconfig's CA, if any), the kubelet kubeconfig it came from ("" when
    DWD_APISERVER_URL overrides it, or DWD_APISERVER_FROM names the environment), and what
    gave it, for the log."""
    url = r.string("DWD_APISERVER_URL").rstrip("/")
    source = r.choice("DWD_APISERVER_FROM", "kubelet-kubeconfig", SOURCES)
    setting, kubeconfig, where, server_from = "DWD_APISERVER_URL", "", "", "DWD_APISERVER_URL"
    endpoint = Endpoint(url)
    if url:
        r.also("DWD_KUBELET_KUBECONFIG")  # known; DWD_APISERVER_URL overrides it
    elif source == "kubernetes-service-host":
        r.also("DWD_KUBELET_KUBECONFIG")
        setting, endpoint = "DWD_APISERVER_FROM", Endpoint(_service_host_url(r))
        where, server_from = "KUBERNETES_SERVICE_HOST ", "KUBERNETES_SERVICE_HOST"
    else:
        # kubelet's own server is the default: it is the path KCM judges (docs/install.md).
        setting = "DWD_KUBELET_KUBECONFIG"
        kubeconfig = r.string(setting, DEFAULT_KUBELET_KUBECONFIG)
        where, server_from = f"{kubeconfig}: server ", kubeconfig
        try:
            endpoint = read_endpoint(kubeconfig)
        except KubeconfigError as e:
            r.problem(setting, f"{e} (or set DWD_APISERVER_URL)")
    if endpoint.server:
        try:
            Origin.from_url(endpoint.server)
        except ValueError as e:
            r.problem(setting, f"{where}{endpoint.server!r} {e}")
    return endpoint, kubeconfig, server_from


def _service_host_url(r: EnvReader) -> str:
    """``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`` where the host is a name:
    Gardener's resource manager (its kubernetes-service-host webhook) sets it to the API
    server's internal domain, the name the kubelet uses. An address is the cluster's own
    Service (kube-proxy, or Gardener's apiserver-proxy): not the path to prove, refused."""
    host = r.env.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = r.env.get("KUBERNETES_SERVICE_PORT", "").strip() or "443"
    if not host:
        r.problem(
            "DWD_APISERVER_FROM",
            "kubernetes-service-host: KUBERNETES_SERVICE_HOST is not set (Gardener's resource manager "
            "sets it with its kubernetes-service-host webhook; or set DWD_APISERVER_URL)",
        )
        return ""
    if _is_address(host.strip("[]")):
        r.problem(
            "DWD_APISERVER_FROM",
            f"kubernetes-service-host: KUBERNETES_SERVICE_HOST is {host}, an address: the cluster's "
            "Service, not the name the kubelet reaches KAPI by (Gardener's kubernetes-service-host "
            "webhook sets the API server's domain; a pod labelled "
            "apiserver-proxy.networking.gardener.cloud/inject=disable is left without it)",
        )
        return ""
    return f"https://{host}:{port}"


def _is_address(host: str) -> bool:
    """An IPv4 or IPv6 address, not a name (socket's parser: ipaddress would cost every node
    0.4 MiB, tests/integration/test_agent.py)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            socket.inet_pton(family, host)
            return True
    return False


def _ca_file(r: EnvReader, endpoint: Endpoint, kubeconfig: str) -> str:
    """DWD_CA_FILE, else the kubelet kubeconfig's certificate-authority file ("" for its data or
    the system store)."""
    ca_file = r.string("DWD_CA_FILE", "")
    setting = "DWD_CA_FILE" if ca_file else "DWD_KUBELET_KUBECONFIG"
    if ca_file and not os.access(ca_file, os.R_OK):
        r.problem("DWD_CA_FILE", f"{ca_file} is not a readable file")
    elif not ca_file and endpoint.ca_file:
        ca_file = endpoint.ca_file
        if not os.access(ca_file, os.R_OK):
            r.problem(
                "DWD_KUBELET_KUBECONFIG",
                f"{kubeconfig}: its certificate-authority {ca_file} is not readable "
                "(mount it too, or set DWD_CA_FILE)",
            )
        else:
            _check_ca(r, setting, ca_file, endpoint, f"{kubeconfig}: its certificate-authority {ca_file}")
    else:
        _check_ca(r, setting, ca_file, endpoint, ca_file or "its certificate-authority-data")
    return ca_file


def _check_ca(r: EnvReader, setting: str, ca_file: str, endpoint: Endpoint, what: str) -> None:
    """The CA the agent will verify KAPI with, loaded once now: one that is not a certificate
    is a setting's error (rc 2, named ``what``), not a traceback at the first renewal."""
    try:
        ssl_context(ca_file, ca_pem="" if ca_file else endpoint.ca_pem)
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        r.problem(setting, f"{what}: not a CA certificate bundle ({e})")
