"""The real kubelet as a hollow node: ``kubemark --morph=kubelet``, one process per node.

kubemark runs the kubelet's own code (registration, node status, the node-lease controller,
pod workers, the eviction manager) on an in-process fake container runtime, as Kubernetes'
scalability tests run it. What it does on the wire is the kubelet's: its Node, its
``kube-node-lease/<node>`` renewed every quarter of 40 s with the lease controller's own
back-off, NodeStatus with its change detection and its 5-minute report.

Its identity is a client certificate CN=system:node:<node>, O=system:nodes from the control
plane's CA, so the Node authorizer and NodeRestriction judge every write. It reaches KAPI at
``server``: KAPI itself, or a load balancer name (a TCP proxy that can be cut), with
``prefix`` (``ns.argv([])``: ``ip netns exec <ns>``) to run it inside a node's network namespace.

Not the kubelet as Gardener runs it: no client certificate rotation, no TLS bootstrap, and no
``onHeartbeatFailure`` (kubemark calls RunKubelet directly): the real one closes its idle
connections after repeated heartbeat failures, but on HTTP/2 the connection carrying its
watches is never idle, so both rely on client-go's pings (30 s without a frame, then 15 s for
the answer) to drop a dead connection (bench/kubelet.py). Its configuration is kubemark's
(GetHollowKubeletConfig), kubelet's defaults where it matters here: node status checked every
10 s and an unchanged one reported every 5 min (±2.5 min after a change), lease duration 40 s.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from core.errors import NotFound
from core.lease import parse_micro_time
from testenv.base import binaries
from testenv.base.kapi import Client
from testenv.base.pki import KeyPair
from testenv.base.process import Process, spawn, stop_all
from testenv.kube.controlplane import ControlPlane, free_port
from testenv.kube.kubelet_identity import node_credentials, write_kubeconfig

NODE_LEASE_NAMESPACE = "kube-node-lease"


def lease_path(node: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases/{node}"


def node_lease(client: Client, node: str) -> dict[str, Any] | None:
    """``kube-node-lease/<node>`` as KAPI holds it; None before the kubelet created it."""
    try:
        return client.get(lease_path(node))
    except NotFound:
        return None


def renew_time(lease: dict[str, Any] | None) -> datetime | None:
    """A node lease's renewTime (the kubelet's clock); None when it has none."""
    text = ((lease or {}).get("spec") or {}).get("renewTime")
    return parse_micro_time(text) if isinstance(text, str) else None


def renewals(client: Client, nodes: Sequence[str]) -> dict[str, float]:
    """Each of ``nodes``' last lease renewal (time.time(), by the kubelet's clock: this
    machine's), from one LIST of kube-node-lease; a node whose kubelet has not renewed yet is
    absent."""
    leases = client.get(f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases")["items"]
    out = {}
    for lease in leases:
        name = lease["metadata"]["name"]
        if name in nodes and (renewed := renew_time(lease)) is not None:
            out[name] = renewed.timestamp()
    return out


def ready_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    """The Node's Ready condition as the kubelet last posted it (or KCM last set it)."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            found: dict[str, Any] = condition
            return found
    return None


@dataclass
class HollowKubelet:
    """One hollow kubelet: ``start()`` issues its node certificate from the control plane's CA,
    writes its kubeconfig and log under ``workdir`` and spawns it; ``stop()`` ends it and
    removes what it left behind."""

    node: str
    cp: ControlPlane
    workdir: Path
    server: str = ""  # KAPI's URL unless given: a load balancer's, whose name KAPI's certificate carries
    prefix: Sequence[str] = ()  # e.g. ns.argv([]): run it inside a network namespace
    extra_args: Sequence[str] = ()
    process: Process | None = field(default=None, init=False)
    keys: KeyPair | None = field(default=None, init=False)  # its client certificate

    @property
    def log_path(self) -> Path:
        return self.workdir / f"kubelet-{self.node}.log"

    def argv(self, keys: KeyPair) -> list[str]:
        kubeconfig = write_kubeconfig(
            self.workdir / f"kubelet-{self.node}.kubeconfig",
            self.server or self.cp.url,
            self.cp.ca_file.read_bytes(),
            keys,
        )
        binary = binaries.find((binaries.KUBEMARK,))[binaries.KUBEMARK.name]
        return [
            *self.prefix,
            str(binary),
            "--morph=kubelet",
            f"--name={self.node}",
            f"--kubeconfig={kubeconfig}",
            # The fake image service: there is no containerd here.
            "--use-host-image-service=false",
            f"--cert-dir={self.workdir / f'certs-{self.node}'}",
            # Its server listens on all addresses: a port of its own, and no read-only one.
            f"--kubelet-port={free_port('0.0.0.0')}",
            "--kubelet-read-only-port=0",
            *self.extra_args,
        ]

    def start(self) -> HollowKubelet:
        assert self.cp.ca is not None, "the control plane is not started"
        self.keys = node_credentials(self.cp.ca, self.node)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = spawn(
            f"kubelet-{self.node}", self.argv(self.keys), log_path=self.log_path, die_with_parent=True
        )
        return self

    def client(self) -> Client:
        """A client with this node's credentials, straight to KAPI: what the Node authorizer
        and NodeRestriction allow it."""
        assert self.keys is not None, "not started"
        return Client(self.cp.url, str(self.cp.ca_file), cert=(str(self.keys.cert), str(self.keys.key)))

    def pause(self) -> None:
        """SIGSTOP: it writes nothing until ``resume()``, its connections open and silent, as a
        frozen node's (for a node whose path is cut, cut its load balancer)."""
        assert self.process is not None, "not started"
        self.process.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.alive():
            self.process.popen.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop it, and remove what it leaves in /tmp (kubemark puts its root directory and its
        fake runtime's socket there, whatever TMPDIR says, and removes neither)."""
        if self.process is None:
            return
        self.resume()  # a stopped process would take its SIGTERM only when continued
        self.process.stop(timeout_s)
        for line in self.log():
            if match := _ROOT_DIR.fullmatch(line.message):
                shutil.rmtree(match.group(1), ignore_errors=True)
        sweep_runtime_sockets()

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def tail(self, lines: int = 30) -> str:
        return self.process.tail(lines) if self.process is not None else ""

    def log(self) -> list[KlogLine]:
        """Its log as klog lines (what it logged at which time, on this machine's clock)."""
        with contextlib.suppress(OSError):
            return [
                line
                for text in self.log_path.read_text(errors="replace").splitlines()
                if (line := klog(text))
            ]
        return []


_ROOT_DIR = re.compile(r"Using (/tmp/hollow-kubelet\.[0-9]+) as root dir for hollow-kubelet")


def sweep_runtime_sockets(directory: Path = Path("/tmp")) -> None:
    """Remove the fake runtime sockets (``kubelet_remote_<random>.sock``) nothing listens on
    any more. Which one is whose cannot be told: kubemark binds a temporary name and renames
    it, so not even its open descriptors name the file."""
    for path in directory.glob("kubelet_remote_*.sock"):
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
            except OSError:
                pass  # not a socket, or not ours to judge


@dataclass(frozen=True)
class KlogLine:
    severity: str  # I, W, E, F
    at: float  # time.time() of the line
    source: str  # file.go:line
    message: str


_KLOG = re.compile(r"^([IWEF])(\d{2})(\d{2}) (\d{2}:\d{2}:\d{2}\.\d{6})\s+\d+ ([^\]]+)\] (.*)$")


def klog(text: str) -> KlogLine | None:
    """One klog header line; None for any other (a continuation, a flag dump)."""
    match = _KLOG.match(text)
    if match is None:
        return None
    severity, month, day, clock, source, message = match.groups()
    # klog stamps local time without a year: this year's, on this machine's zone.
    now = datetime.now().astimezone()
    stamp = datetime.strptime(f"{now.year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f")
    return KlogLine(severity, stamp.replace(tzinfo=now.tzinfo).timestamp(), source, message)


@contextlib.contextmanager
def running(kubelets: Sequence[HollowKubelet]) -> Iterator[Sequence[HollowKubelet]]:
    """Each of ``kubelets`` started (each with its own ``server`` or ``prefix`` where a node
    has its own load balancer or namespace), all stopped on the way out."""
    try:
        for kubelet in kubelets:
            kubelet.start()
        yield kubelets
    finally:
        # SIGTERM to all first: they shut down side by side (a paused one continued to take it).
        for kubelet in kubelets:
            kubelet.resume()
        stop_all(k.process for k in kubelets if k.process is not None)
        for kubelet in kubelets:
            kubelet.stop()
