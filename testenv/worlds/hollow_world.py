"""Hollow kubelets (testenv/kube/hollow.py) on one control plane, each reaching KAPI through a load
balancer of its own (testenv/net/tcpproxy.py) with its node credentials, for ``bench.kubelet``; the
record of what their leases and Nodes showed, listed every 100 ms through the admin client
straight to KAPI; every load balancer cut and healed; KCM's write for a node past its grace."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from core.lease import parse_micro_time
from testenv.base.kapi import Client
from testenv.base.poller import Poller
from testenv.base.wait import wait_for
from testenv.kube.controlplane import ControlPlane
from testenv.kube.hollow import NODE_LEASE_NAMESPACE, HollowKubelet, ready_condition, running
from testenv.net.tcpproxy import TcpProxy

POLL_S = 0.1


@dataclass(frozen=True)
class Seen:
    """A value of a node's lease or Ready condition, and when our reads first showed it."""

    value: str
    at: float  # time.time() when the read that first showed it answered
    unseen_at: float  # when the read before it was sent: the write came after that

    @property
    def stamp(self) -> float:
        """A renewTime as time.time() (the node's clock, this machine's here)."""
        return parse_micro_time(self.value).timestamp()


class Reads(Poller):
    """Every lease in kube-node-lease and every Node, listed every 100 ms straight to KAPI;
    each change of a node's renewTime and of its Ready condition, with when it was seen."""

    def __init__(self, cp: ControlPlane, nodes: Sequence[str]) -> None:
        super().__init__("hollow-reads", POLL_S, fixed_rate=True)
        self.client = cp.admin_client()
        self.leases: dict[str, list[Seen]] = {n: [] for n in nodes}
        self.ready: dict[str, list[Seen]] = {n: [] for n in nodes}
        self._sent = -math.inf

    def step(self) -> None:
        sent = time.time()
        leases = self.client.get(f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases")
        nodes = self.client.get("/api/v1/nodes")
        at = time.time()
        for lease in leases["items"]:
            self._note(self.leases, lease["metadata"]["name"], lease["spec"].get("renewTime"), at)
        for node in nodes["items"]:
            ready = ready_condition(node) or {}
            value = f"{ready.get('status')} {ready.get('lastHeartbeatTime')}" if ready else None
            self._note(self.ready, node["metadata"]["name"], value, at)
        self._sent = sent

    def _note(self, series: dict[str, list[Seen]], node: str, value: str | None, at: float) -> None:
        if node in series and value and (not series[node] or series[node][-1].value != value):
            series[node].append(Seen(value, at, self._sent))

    def close(self) -> None:
        self.client.close()

    def renewals_between(self, node: str, start: float, end: float) -> list[Seen]:
        return [s for s in self.leases[node] if start <= s.at <= end]


@dataclass
class Rig:
    cp: ControlPlane
    kubelets: Sequence[HollowKubelet]
    proxies: dict[str, TcpProxy]
    reads: Reads
    admin: Client

    @property
    def nodes(self) -> list[str]:
        return [k.node for k in self.kubelets]


@contextlib.contextmanager
def rig(n: int, workdir: Path) -> Iterator[Rig]:
    """A control plane, a load balancer and a hollow kubelet per node, the reads running; every
    kubelet has registered, turned Ready and renewed its lease once."""
    nodes = [f"hollow-{i}" for i in range(n)]
    with contextlib.ExitStack() as stack:
        cp = stack.enter_context(ControlPlane().running())
        upstream = ("127.0.0.1", urlparse(cp.url).port or 443)
        proxies = {node: TcpProxy(upstream).open() for node in nodes}
        for proxy in proxies.values():
            stack.callback(proxy.shutdown)
        kubelets = [
            HollowKubelet(node, cp, workdir, server=f"https://127.0.0.1:{proxies[node].port}")
            for node in nodes
        ]
        stack.enter_context(running(kubelets))
        reads = Reads(cp, nodes)
        reads.start()
        stack.callback(reads.stop)
        r = Rig(cp, kubelets, proxies, reads, stack.enter_context(cp.admin_client()))
        wait_for(lambda: all(r.reads.leases.values()) and _all_ready(r), 90, "every hollow kubelet Ready")
        yield r


def _all_ready(r: Rig) -> bool:
    for k in r.kubelets:
        assert k.alive(), k.tail()
    return all(seen and seen[-1].value.startswith("True ") for seen in r.reads.ready.values())


def set_cut(r: Rig, kind: str, *, cut: bool) -> None:
    """Every load balancer cut (or healed): "blackhole" drops the packets, open connections
    never hear a close; "refused" closes it, resetting them and refusing new ones."""
    for proxy in r.proxies.values():
        if kind == "blackhole":
            proxy.blackhole = cut
        elif cut:
            proxy.close()
        else:
            proxy.open()


def mark_unknown(admin: Client, node: str) -> None:
    """What KCM writes when a node's grace has passed: Ready=Unknown, the heartbeat kept."""
    obj = admin.get(f"/api/v1/nodes/{node}")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for condition in obj["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition.update(status="Unknown", reason="NodeStatusUnknown", lastTransitionTime=now)
            condition["message"] = "Kubelet stopped posting node status."
    admin.put(f"/api/v1/nodes/{node}/status", obj)
