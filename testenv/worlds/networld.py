"""A node in its own network namespace, reaching KAPI the way a shoot node does: its own
resolver (a real DNS server on the host side), the external name, a load balancer."""

from __future__ import annotations

import contextlib
import random
import socket
import ssl
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testenv.base import containers
from testenv.base.pki import CertificateAuthority
from testenv.base.process import Process, json_log
from testenv.kube.controlplane import ControlPlane
from testenv.kube.kubelet_identity import write_kubeconfig
from testenv.net.dns import DnsServer
from testenv.net.names import EXTERNAL_NAMES
from testenv.net.netns import NetNs, _ip, unused
from testenv.net.tcpproxy import TcpProxy
from testenv.worlds.agents import ByKubeconfig, ByUrl, pod_env, start_agent

API, INTERNAL_API = EXTERNAL_NAMES


class ImpostorTls:
    """A TLS server with a certificate from a CA nobody trusts: where tampered DNS sends a node."""

    def __init__(self, address: str, directory: Path, port: int = 443) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        pair = CertificateAuthority(directory, "impostor").issue(
            "impostor", API, dns_names=[API], server=True
        )
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(pair.cert, pair.key)
        self.sock = socket.create_server((address, port))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with contextlib.suppress(OSError, ssl.SSLError):
                    self.ctx.wrap_socket(conn, server_side=True).close()
                conn.close()

    def close(self) -> None:
        # close() alone leaves the socket listening while the thread is blocked in accept(),
        # bound to an address a later world may draw; shutdown() wakes the accept first.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


def _iptables(action: str, chain: str, *rule: str) -> None:
    subprocess.run(["iptables", action, chain, *rule], check=True, capture_output=True)


@dataclass
class Node:
    name: str
    ns: NetNs
    lb: TcpProxy
    impostor_ip: str
    agent: Process | None = None
    log: Path | None = None
    container: str | None = None  # the agent's container, when it runs from the image
    # The kubelet's own load balancer, under INTERNAL_API (add_internal_path).
    internal_lb: TcpProxy | None = None
    # The loss rules in place now, each as given to iptables after the chain name.
    loss_rules: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def events(self) -> list[dict[str, Any]]:
        assert self.log is not None
        return json_log(self.log)

    def iptables(self, action: str, *rule: str) -> None:
        subprocess.run(
            ["iptables", action, "INPUT", "-i", self.ns.host_if, "-p", "tcp", "--dport", "443", *rule],
            check=True,
            capture_output=True,
        )

    def set_loss(self, probability: float) -> None:
        """Drop this share of the packets between the node and its load balancer, each way
        (0 removes the rules). DNS is left alone: ``DnsServer.drop`` loses its answers."""
        for chain, rule in self.loss_rules:
            with contextlib.suppress(subprocess.CalledProcessError):
                _iptables("-D", chain, *rule)
        self.loss_rules = []
        if probability <= 0:
            return
        lossy = ("-m", "statistic", "--mode", "random", "--probability", f"{probability:.4f}", "-j", "DROP")
        for chain, rule in (
            ("INPUT", ("-i", self.ns.host_if, "-p", "tcp", "--dport", "443", *lossy)),
            ("OUTPUT", ("-o", self.ns.host_if, "-p", "tcp", "--sport", "443", *lossy)),
        ):
            _iptables("-I", chain, *rule)
            self.loss_rules.append((chain, rule))


@dataclass
class World:
    cp: ControlPlane
    tmp: Path
    nodes: dict[str, Node] = field(default_factory=dict)
    tampered: set[str] = field(default_factory=set)
    dns: DnsServer | None = None
    impostors: list[ImpostorTls] = field(default_factory=list)

    def resolve(self, name: str, address: str) -> str | None:
        node = next(n for n in self.nodes.values() if n.ns.host_ip == address)
        if name == INTERNAL_API and node.internal_lb is not None:
            return node.internal_lb.listen[0]
        if name != API:
            return None
        return node.impostor_ip if node.name in self.tampered else address

    def add_internal_path(self, node: Node) -> TcpProxy:
        """A second way to KAPI for this node: INTERNAL_API resolves to a load balancer of its
        own, on an address of its own (Gardener's internal domain, which kubelet uses)."""
        ip = unused(lambda: f"10.215.{random.randrange(256)}.{random.randrange(1, 255)}")
        _ip("addr", "add", f"{ip}/32", "dev", node.ns.host_if)
        _ip("netns", "exec", node.ns.name, "ip", "route", "add", f"{ip}/32", "via", node.ns.host_ip)
        kapi_port = int(self.cp.url.rsplit(":", 1)[1])
        node.internal_lb = TcpProxy(upstream=("127.0.0.1", kapi_port), listen=(ip, 443)).open()
        return node.internal_lb

    def add_node(self, name: str) -> Node:
        ns = NetNs(resolver=True).create()
        try:
            impostor_ip = unused(lambda: f"10.214.{random.randrange(256)}.{random.randrange(1, 255)}")
            _ip("addr", "add", f"{impostor_ip}/32", "dev", ns.host_if)
            _ip("netns", "exec", ns.name, "ip", "route", "add", f"{impostor_ip}/32", "via", ns.host_ip)
            kapi_port = int(self.cp.url.rsplit(":", 1)[1])
            lb = TcpProxy(upstream=("127.0.0.1", kapi_port), listen=(ns.host_ip, 443)).open()
        except BaseException:
            ns.delete()  # not a node of this world yet: close() would not find it
            raise
        self.impostors.append(ImpostorTls(impostor_ip, self.tmp / f"impostor-{name}"))
        node = Node(name, ns, lb, impostor_ip)
        self.nodes[name] = node
        return node

    def start_dns(self) -> None:
        self.dns = DnsServer(self.resolve, [n.ns.host_ip for n in self.nodes.values()]).start()

    def start_agent(
        self,
        node: Node,
        env: Mapping[str, str] | None = None,
        *,
        fast: bool = True,
        kubeconfig: Path | None = None,
    ) -> None:
        """The agent in the node's namespace, reaching KAPI by the external name, or by the server
        and CA of a kubelet ``kubeconfig``; ``env`` over its settings. ``fast``: renew every
        500 ms with 200 ms attempts, for tests about classes and recovery; ``fast=False`` leaves
        the agent's own timings, for tests about a slow path."""
        token = self.tmp / f"{node.name}.token"
        token.write_text(self.cp.node_token(node.name))
        node.log = self.tmp / f"agent-{node.name}.log"
        settings = {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            **({"DWD_RENEW_INTERVAL": "500ms", "DWD_REQUEST_TIMEOUT": "200ms"} if fast else {}),
            "DWD_LOG_FORMAT": "json",
            **(env or {}),
        }
        server = ByUrl(f"https://{API}", self.cp.ca_file) if kubeconfig is None else ByKubeconfig(kubeconfig)
        node.agent = start_agent(
            node.name, token_file=token, server=server, log_path=node.log, env=settings, netns=node.ns
        )

    def start_agent_container(
        self, node: Node, image: str, daemonset: dict[str, Any], env: Mapping[str, str] | None = None
    ) -> None:
        """The agent from its image as the DaemonSet runs it: the DaemonSet's environment and
        user, its token and the kubelet kubeconfig at the DaemonSet's mount paths, a read-only root, the
        node's network namespace (hostNetwork) and the node's resolver (dnsPolicy: Default)."""
        spec = daemonset["spec"]["template"]["spec"]
        container = spec["containers"][0]
        assert spec["hostNetwork"] and spec.get("dnsPolicy") == "Default"
        assert container["securityContext"]["readOnlyRootFilesystem"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        creds = self.tmp / f"creds-{node.name}"
        creds.mkdir(mode=0o755)
        (creds / "token").write_text(self.cp.node_token(node.name))
        # The node's kubelet kubeconfig, 0600 root as kubelet leaves it: the agent takes its
        # server (this world's external name) and CA from it.
        kubeconfig = write_kubeconfig(
            self.tmp / f"kubeconfig-{node.name}", f"https://{API}", self.cp.ca_file.read_bytes()
        )
        full_env = pod_env(container, node=node.name, host_ip=node.ns.ns_ip)
        node.log = self.tmp / f"agent-{node.name}.log"
        node.container = f"dwd-agent-{node.ns.name}"
        user = spec["securityContext"]
        node.agent = containers.run(
            image,
            name=node.container,
            log_path=node.log,
            env={**full_env, **(env or {})},
            mounts={creds: mounts["credentials"], kubeconfig: mounts["kubelet-kubeconfig"]},
            network=f"ns:/run/netns/{node.ns.name}",
            dns=[node.ns.host_ip],
            user=f"{user['runAsUser']}:{user['runAsGroup']}",
        )

    def close(self) -> None:
        # Rules first: they live on the host and outlast everything else if left behind.
        for node in self.nodes.values():
            node.set_loss(0)
        for node in self.nodes.values():
            if node.agent is not None:
                node.agent.stop(5)
            if node.container is not None:
                containers.remove(node.container)
            # Rules may still be in place after a failed test.
            for action in ("DROP", "REJECT"):
                with contextlib.suppress(subprocess.CalledProcessError):
                    while True:
                        node.iptables(
                            "-D",
                            "-j",
                            action,
                            *(["--reject-with", "tcp-reset"] if action == "REJECT" else []),
                        )
            node.lb.shutdown()
            if node.internal_lb is not None:
                node.internal_lb.shutdown()
            node.ns.delete()
        if self.dns is not None:
            self.dns.stop()
        for imp in self.impostors:
            imp.close()
