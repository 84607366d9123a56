"""What reading kubelet leases costs: a LIST, a watch, the sample's GETs; and Node LISTs.

``python -m bench.witness_cost [--nodes 5000] [--interval-s 10] [--watch-s 60] [--lists 20]
[--watchers 1] [--node-lists 5] [--no-node-objects] [--out FILE]``

One real kube-apiserver and etcd (testenv), N kubelet leases in kube-node-lease renewed by
``bench.kubelet_writer`` in its own process at kubelet's pace (every 10 s each: N/10 writes
a second), and N agent leases in dwd-node-lease (not renewed: the interlock LISTs them, the
write rate that matters is the kubelets'). The reading is done here, with the aggregator's
own code (``KubeClient``, ``KubeletLeases``, ``Informer``, ``LeaseView``, ``NodeView``), so
this process's CPU time is what the aggregator would spend. Measured:

1. one LIST of the kubelet leases (``KubeletLeases.read``): latency, bytes read from the
   socket (``rchar`` of /proc/self/io: TLS records, gzip as KAPI sent it), this process's
   CPU, and kube-apiserver's and etcd's CPU above their rate without reads;
2. a watch of kube-node-lease through the aggregator's ``Informer`` (its 10 s watch
   timeout, resumed at once) for ``--watch-s``, in blocks of about 20 s alternating with
   as long without it; kube-apiserver's share per lease PUT served, since on a shared
   machine the write rate moves with the load (``--watchers`` several at once, so that
   share stands out of the noise);
3. the judged sample's kubelet leases by name (k GETs, at most 16 at a time: KubeClient's
   pool), and whether a fieldSelector can ask for several names in one LIST;
4. the interlock's reads right before a scale-down: probe and the agents' LIST, with the
   kubelets' LIST after it (today), or beside it;
5. (unless ``--no-node-objects``, writer stopped) N Node objects with a kubelet-like status:
   LIST as full objects and as PartialObjectMetadataList, parsed into ``NodeView``, and the
   memory of holding the parsed views against holding the raw objects (tracemalloc).

kube-apiserver's and etcd's CPU per read is taken with the writer stopped (SIGSTOP): under
the writes their own rate moves by more than a read costs. CPU is utime+stime from
/proc/<pid>/stat (10 ms ticks), in % of one core; the machine has
2 cores, shared by the writer, kube-apiserver, etcd and this process (and by whatever else
runs: the load average is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import hashlib
import json
import os
import signal
import ssl
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import uvloop

from aggregator import budget
from aggregator.kube import METADATA_LIST, KubeClient, load_kubeconfig
from aggregator.objects import NodeView, metadata, section
from aggregator.settings import Decider, Provisioning, Watching
from aggregator.watcher import Informer, Observed
from aggregator.witness import NODE_LEASE_NAMESPACE, KubeletLeases, KubeletObs, micro_time
from bench import kubelet_writer
from bench.kapi_metrics import REQUESTS, parse_metrics, requests, resource_total
from bench.sampling import CLK_TCK, bytes_read, cpu_ticks, load_average
from bench.stats import quantile
from bench.table import print_table
from core.durations import format_duration
from core.errors import ApiError
from core.lease import DEFAULT_LEASE_NAMESPACE, RENEW_INTERVAL, LeaseView, lease_path, leases_path
from testenv.controlplane import ControlPlane
from testenv.process import Process, spawn

T = TypeVar("T")
# The aggregator's defaults this page is about.
WITNESS_EVERY_S = Decider().witness_every_s
FAST_S = Decider().fast_interval_s
BUDGET = Provisioning().write_budget
ZONES = ("zone-a", "zone-b", "zone-c")


# -- pure pieces (tests/unit/test_witness_cost.py)


@dataclass(frozen=True)
class Cost:
    """What one way of reading costs over an hour."""

    requests: float
    mib: float
    aggregator_cpu_s: float
    kapi_cpu_s: float


def per_hour_polled(
    every_s: float, mib: float, aggregator_cpu_s: float, kapi_cpu_s: float, calls: int = 1
) -> Cost:
    """A read repeated every ``every_s`` for an hour; the figures are one read's (of ``calls``
    requests)."""
    n = 3600 / every_s
    return Cost(n * calls, n * mib, n * aggregator_cpu_s, n * kapi_cpu_s)


def per_hour_watched(events_per_s: float, bytes_per_s: float, aggregator_pct: float, kapi_pct: float) -> Cost:
    """A watch held for an hour; the figures are its rates. Its requests are the re-watches,
    one per timeout: ``Watching.timeout_s`` and half its jitter on average."""
    w = Watching()
    return Cost(
        3600 / (w.timeout_s * (1 + w.timeout_jitter / 2)),
        bytes_per_s * 3600 / 2**20,
        aggregator_pct / 100 * 3600,
        kapi_pct / 100 * 3600,
    )


def scale_to(measured_per_s: float, real_per_s: float) -> float:
    """The factor that takes a watch's figures from the event rate measured to kubelet's real
    one (per event: events, bytes and CPU grow with it); 1 within 5 %, where it is not worth
    an extrapolation."""
    if measured_per_s <= 0 or abs(measured_per_s - real_per_s) <= 0.05 * real_per_s:
        return 1.0
    return real_per_s / measured_per_s


def excess_cpu_s(ticks: int, span_s: float, idle_rate_per_s: float) -> float:
    """CPU seconds spent over ``span_s`` above what the process spends at its idle rate."""
    return ticks / CLK_TCK - idle_rate_per_s * span_s


# -- processes


class Ticks:
    """CPU ticks of named processes between two points."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.t0 = time.monotonic()
        self.at0 = {k: cpu_ticks(p) for k, p in self.pids.items()}
        self.cpu0 = time.process_time()

    def stop(self) -> tuple[float, dict[str, int], float]:
        """Elapsed s, ticks per process, this process's CPU s (process_time: finer than ticks)."""
        return (
            time.monotonic() - self.t0,
            {k: cpu_ticks(p) - self.at0[k] for k, p in self.pids.items()},
            time.process_time() - self.cpu0,
        )


@contextlib.contextmanager
def writer_process(
    plane: ControlPlane, nodes: int, interval_s: float, stats: Path, log: Path
) -> Iterator[Process]:
    argv = [
        sys.executable,
        "-m",
        "bench.kubelet_writer",
        plane.url,
        str(plane.ca_file),
        str(plane.admin.cert),
        str(plane.admin.key),
        "--nodes",
        str(nodes),
        "--interval-s",
        str(interval_s),
        "--connections",
        "64",
        "--stats",
        str(stats),
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = spawn("kubelet-writer", argv, log_path=log, env=env)
    try:
        yield proc
    finally:
        proc.stop()


def writer_stats(stats: Path) -> list[dict[str, Any]]:
    if not stats.exists():
        return []
    out = []
    for line in stats.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def writer_rate(stats: Path, since_t: float) -> dict[str, float]:
    """Renewals answered per second since ``since_t`` (the writer's clock), and the worst
    backlog and p99 of any second."""
    rows = [r for r in writer_stats(stats) if "t" in r and r["t"] >= since_t]
    if not rows:
        return {"writes_per_s": 0.0, "errors": 0, "skipped": 0, "max_waiting": 0, "max_p99_ms": 0.0}
    return {
        "writes_per_s": round(sum(r["ok"] for r in rows) / len(rows), 1),
        "errors": sum(r["errors"] for r in rows),
        "skipped": sum(r.get("skipped", 0) for r in rows),
        "max_waiting": max(r["waiting"] for r in rows),
        "max_p99_ms": max(r["p99_ms"] for r in rows),
    }


def writer_clock(stats: Path) -> float:
    rows = [r for r in writer_stats(stats) if "t" in r]
    return float(rows[-1]["t"]) if rows else 0.0


# -- objects


def agent_lease(name: str, fast: bool) -> dict[str, Any]:
    """A dwd-node-lease Lease as the aggregator provisions it and the agent renews it."""
    return {
        "metadata": {
            "name": name,
            "annotations": {RENEW_INTERVAL: format_duration(FAST_S) if fast else "2m"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": f"uid-{name}"}],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": 8,
            "renewTime": "2026-12-01T12:00:00.000000Z",
        },
    }


IMAGES = (
    "calico/node",
    "calico/cni",
    "calico/typha",
    "kube-proxy",
    "coredns/coredns",
    "node-local-dns",
    "node-problem-detector",
    "vpn-shoot-client",
    "apiserver-proxy",
    "envoyproxy/envoy-distroless",
    "ebs-csi-driver",
    "csi-node-driver-registrar",
    "csi-liveness-probe",
    "blackbox-exporter",
    "node-exporter",
    "fluent-bit",
    "pause",
    "egress-filter-refresher",
    "metrics-server",
    "dwd-lease-agent",
)


NODE_RESOURCES = {
    "cpu": "4",
    "ephemeral-storage": "50620216Ki",
    "hugepages-1Gi": "0",
    "hugepages-2Mi": "0",
    "memory": "16110404Ki",
    "pods": "110",
}
# (type, status, reason, message), as kubelet and Calico report them.
NODE_CONDITIONS = (
    ("NetworkUnavailable", "False", "CalicoIsUp", "Calico is running on this node"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)
NODE_INFO = {
    "kernelVersion": "6.6.62-cloud-amd64",
    "osImage": "Garden Linux 1592.4",
    "containerRuntimeVersion": "containerd://1.7.24",
    "kubeletVersion": "v1.31.4",
    "kubeProxyVersion": "",
    "operatingSystem": "linux",
    "architecture": "amd64",
}


def _node_labels(name: str, zone: str, hostname: str) -> dict[str, str]:
    return {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": "m5.xlarge",
        "beta.kubernetes.io/os": "linux",
        "failure-domain.beta.kubernetes.io/region": "eu-west-1",
        "failure-domain.beta.kubernetes.io/zone": zone,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": hostname,
        "kubernetes.io/os": "linux",
        "networking.gardener.cloud/node-local-dns-enabled": "true",
        "node.kubernetes.io/instance-type": "m5.xlarge",
        "node.kubernetes.io/role": "node",
        "topology.ebs.csi.aws.com/zone": zone,
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": zone,
        "worker.gardener.cloud/kubernetes-version": "1.31.4",
        "worker.gardener.cloud/pool": "worker-a",
        "worker.gardener.cloud/system-components": "true",
        "worker.garden.sapcloud.io/group": "worker-a",
        "node.gardener.cloud/machine-name": f"shoot--dev--bench-worker-a-z1-5f6d8-{name}",
    }


def _node_annotations(instance: str) -> dict[str, str]:
    applied = {
        "metadata": {"labels": {"node.kubernetes.io/role": "node", "worker.gardener.cloud/pool": "worker-a"}}
    }
    return {
        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": instance}),
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "checksum/cloud-config-data": hashlib.sha256(b"cloud-config").hexdigest(),
        "node.machine.sapcloud.io/last-applied-anno-labels-taints": json.dumps(applied),
    }


def _node_images() -> list[dict[str, Any]]:
    return [
        {
            "names": [
                f"europe-docker.pkg.dev/gardener-project/releases/{image}@sha256:"
                + hashlib.sha256(image.encode()).hexdigest(),
                f"europe-docker.pkg.dev/gardener-project/releases/{image}:v1.{j}.3",
            ],
            "sizeBytes": 12_000_000 + j * 3_141_593,
        }
        for j, image in enumerate(IMAGES)
    ]


def _node_status(name: str, ip: str, hostname: str, instance: str) -> dict[str, Any]:
    beat = "2026-12-01T12:00:00Z"
    conditions = [
        {
            "type": kind,
            "status": status,
            "lastHeartbeatTime": beat,
            "lastTransitionTime": "2026-11-28T08:14:03Z",
            "reason": reason,
            "message": message,
        }
        for kind, status, reason, message in NODE_CONDITIONS
    ]
    return {
        "capacity": dict(NODE_RESOURCES),
        "allocatable": {**NODE_RESOURCES, "cpu": "3920m", "memory": "14941956Ki"},
        "conditions": conditions,
        "addresses": [
            {"type": "InternalIP", "address": ip},
            {"type": "InternalDNS", "address": hostname},
            {"type": "Hostname", "address": hostname},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": hashlib.md5(name.encode(), usedforsecurity=False).hexdigest(),
            "systemUUID": "ec2" + hashlib.md5(instance.encode(), usedforsecurity=False).hexdigest()[3:],
            "bootID": hashlib.sha1(name.encode(), usedforsecurity=False).hexdigest()[:32],
            **NODE_INFO,
        },
        "images": _node_images(),
    }


def node_object(i: int) -> dict[str, Any]:
    """A Node as a kubelet on a cloud VM registers and reports it: Gardener's labels, 5
    conditions, 3 addresses, capacity and allocatable, nodeInfo, 20 images."""
    name = kubelet_writer.node_name(i)
    zone = ZONES[i % len(ZONES)]
    ip = f"10.250.{i // 250}.{i % 250 + 1}"
    hostname = f"ip-{ip.replace('.', '-')}.eu-west-1.compute.internal"
    instance = "i-0" + hashlib.sha256(name.encode()).hexdigest()[:16]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": _node_labels(name, zone, hostname),
            "annotations": _node_annotations(instance),
        },
        "spec": {
            "podCIDR": f"100.96.{i % 256}.0/24",
            "podCIDRs": [f"100.96.{i % 256}.0/24"],
            "providerID": f"aws:///eu-west-1{zone[-1]}/{instance}",
        },
        "status": _node_status(name, ip, hostname, instance),
    }


# -- reading


async def gather_limited(calls: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(c) for c in calls))


# One block of the watch bench: elapsed s, CPU ticks by process, this process's CPU s,
# events, bytes read, lease PUTs served.
Block = tuple[float, dict[str, int], float, int, int, float]


@dataclass
class Spent:
    """The blocks of one kind (with the watch, or without it) added up."""

    span_s: float = 0.0
    own_s: float = 0.0
    events: int = 0
    wire: int = 0
    puts: float = 0.0
    ticks: dict[str, int] = field(default_factory=dict)

    def add(self, block: Block) -> None:
        dt, by, own, events, wire, puts = block
        self.span_s += dt
        self.own_s += own
        self.events += events
        self.wire += wire
        self.puts += puts
        for k, v in by.items():
            self.ticks[k] = self.ticks.get(k, 0) + v

    def pct(self, process: str) -> float:
        return round(self.ticks[process] / CLK_TCK / self.span_s * 100, 1)

    def ms_per_write(self, process: str) -> float:
        return round(self.ticks[process] / CLK_TCK / max(self.puts, 1) * 1000, 3)


def watch_figures(
    w: Spent, wo: Spent, *, blocks: int, watchers: int, encoding: str, pids: Iterable[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The watch's figures (per watcher), and those of the spans without it (the idle rates
    every other figure is measured against)."""
    dt, base_dt = w.span_s, wo.span_s
    watch: dict[str, Any] = {
        "span_s": round(dt, 1),
        "blocks": blocks,
        "watchers": watchers,
        # Per watcher from here on.
        "events_per_s": round(w.events / dt / watchers, 1),
        "wire_bytes_per_s": round(w.wire / dt / watchers),
        "bytes_per_event": round(w.wire / max(w.events, 1)),
        "aggregator_cpu_pct": round(w.own_s / dt * 100 / watchers, 2),
        "aggregator_cpu_pct_without": round(wo.own_s / base_dt * 100 / watchers, 2),
        "aggregator_us_per_event": round((w.own_s - wo.own_s / base_dt * dt) / max(w.events, 1) * 1e6),
        "watch_encoding": encoding,
        "writes_per_s_with": round(w.puts / dt, 1),
        "writes_per_s_without": round(wo.puts / base_dt, 1),
    }
    # Per write, because on a saturated machine the write rate itself moves with the load:
    # kube-apiserver's CPU per lease PUT served, with a watcher and without one.
    for process in ("kube-apiserver", "etcd"):
        watch[f"{process}_ms_per_write_with"] = w.ms_per_write(process)
        watch[f"{process}_ms_per_write_without"] = wo.ms_per_write(process)
    for process in pids:
        watch[f"{process}_cpu_pct"] = w.pct(process)
        watch[f"{process}_cpu_pct_without"] = wo.pct(process)
    without = {
        "span_s": round(base_dt, 1),
        "idle": {k: v / CLK_TCK / base_dt for k, v in wo.ticks.items()},
        **{f"{k}_cpu_pct": wo.pct(k) for k in pids},
    }
    return watch, without


class KubeletSeen:
    """What an Informer of the kubelet leases keeps, and the events it has had."""

    def __init__(self) -> None:
        self.seen: dict[str, KubeletObs] = {}
        self.events = 0

    @staticmethod
    def parse(obj: Mapping[str, Any]) -> tuple[str, KubeletObs]:
        # What KubeletLeases.read does with each item, done per event instead.
        name = metadata(obj).get("name")
        if not isinstance(name, str):
            raise ValueError("no name")
        return name, KubeletObs(micro_time(section(obj, "spec").get("renewTime")), time.monotonic())

    def on_list(self, views: list[tuple[str, KubeletObs]]) -> None:
        self.seen.update(views)

    def on_event(self, kind: str, view: tuple[str, KubeletObs]) -> None:
        self.events += 1
        if kind == "DELETED":
            self.seen.pop(view[0], None)
        else:
            self.seen[view[0]] = view[1]


class Bench:
    def __init__(self, plane: ControlPlane, args: argparse.Namespace) -> None:
        self.plane = plane
        self.args = args
        self.n: int = args.nodes
        endpoint = load_kubeconfig(plane.kubeconfig)
        self.client = KubeClient(lambda: endpoint, timeout_s=60)
        tls = ssl.create_default_context(cafile=str(plane.ca_file))
        tls.load_cert_chain(str(plane.admin.cert), str(plane.admin.key))
        self.tls = tls
        self.pids = {p.name: p.popen.pid for p in plane._procs}
        self.names = [kubelet_writer.node_name(i) for i in range(self.n)]
        zones = {x: ZONES[i % len(ZONES)] for i, x in enumerate(self.names)}
        self.sample = sorted(budget.plan(self.names, FAST_S, BUDGET, zones).fast)
        self.r: dict[str, Any] = {"nodes": self.n, "load_before": load_average()}

    @contextlib.contextmanager
    def writes_paused(self) -> Iterator[None]:
        """The writer stopped (SIGSTOP): kube-apiserver then idles at a few % of a core, so the
        CPU a read costs it stands out of its rate without reads; under 500 writes/s on a
        shared machine that rate moves by more than a LIST costs."""
        pid = self.pids.get("writer")
        if pid is None:
            yield
            return
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(1)  # the writes in flight answered
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    @contextlib.asynccontextmanager
    async def raw(self, decompress: bool) -> AsyncIterator[aiohttp.ClientSession]:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.tls), auto_decompress=decompress, trust_env=False
        ) as session:
            yield session

    async def sizes(self, path: str, accept: str = "application/json") -> dict[str, Any]:
        """The response as JSON text and as sent with gzip allowed (what KubeClient gets)."""
        out: dict[str, Any] = {}
        async with self.raw(decompress=False) as s:
            for encoding in ("identity", "gzip, deflate"):
                async with s.get(
                    self.plane.url + path, headers={"Accept": accept, "Accept-Encoding": encoding}
                ) as r:
                    body = await r.read()
                    out[encoding] = {"bytes": len(body), "encoding": r.headers.get("Content-Encoding", "")}
        return {
            "json_bytes": out["identity"]["bytes"],
            "gzip_bytes": out["gzip, deflate"]["bytes"],
            "encoding": out["gzip, deflate"]["encoding"],
        }

    async def metrics(self) -> str:
        async with self.raw(decompress=True) as s, s.get(self.plane.url + "/metrics") as r:
            return await r.text()

    async def create_agent_leases(self) -> None:
        await self.ensure_namespace(DEFAULT_LEASE_NAMESPACE)
        fast = set(self.sample)
        path = leases_path(DEFAULT_LEASE_NAMESPACE)
        await gather_limited(
            [functools.partial(self.client.create, path, agent_lease(x, x in fast)) for x in self.names], 32
        )

    async def ensure_namespace(self, name: str) -> None:
        with contextlib.suppress(ApiError):
            await self.client.create("/api/v1/namespaces", {"metadata": {"name": name}})

    async def paired(self, read: Callable[[], Awaitable[object]], times: int) -> dict[str, Any]:
        """``times`` reads, each followed by as long a span without reads (at least 0.5 s):
        kube-apiserver's and etcd's CPU above that span's is the read's own, at the same write
        rate and outside load (both drift over minutes on a shared machine)."""
        await read()  # warm: the connections, the first TLS handshakes
        lat, cpu, wire = [], [], []
        spans = {"busy": 0.0, "idle": 0.0}
        ticks: dict[str, dict[str, int]] = {"busy": {}, "idle": {}}
        for _ in range(times):
            t, b0, c0, t0 = Ticks(self.pids), bytes_read(), time.process_time(), time.perf_counter()
            await read()
            lat.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            wire.append(bytes_read() - b0)
            dt, by, _ = t.stop()
            spans["busy"] += dt
            for k, v in by.items():
                ticks["busy"][k] = ticks["busy"].get(k, 0) + v
            t = Ticks(self.pids)
            await asyncio.sleep(max(dt, 0.5))
            dt, by, _ = t.stop()
            spans["idle"] += dt
            for k, v in by.items():
                ticks["idle"][k] = ticks["idle"].get(k, 0) + v

        def excess_ms(process: str) -> float:
            idle_rate = ticks["idle"][process] / CLK_TCK / spans["idle"]
            return round(excess_cpu_s(ticks["busy"][process], spans["busy"], idle_rate) / times * 1000, 1)

        return {
            "p50_ms": round(quantile(lat, 0.5) * 1000, 1),
            "p99_ms": round(quantile(lat, 0.99) * 1000, 1),
            "aggregator_cpu_ms": round(statistics.mean(cpu) * 1000, 1),
            "wire_bytes": round(statistics.mean(wire)),
            "kapi_cpu_ms": excess_ms("kube-apiserver"),
            "etcd_cpu_ms": excess_ms("etcd"),
        }

    # 1. one LIST
    async def kubelet_list(self) -> dict[str, Any]:
        kubelets = KubeletLeases(self.client)
        m0 = await self.metrics()
        out = await self.paired(kubelets.read, self.args.lists)
        m1 = await self.metrics()
        with self.writes_paused():
            paused = await self.paired(kubelets.read, self.args.lists)
        return {
            "items": len(kubelets.leases),
            **out,
            "paused": paused,
            "served": served_from(m0, m1, "leases", self.args.lists + 1),
            **await self.sizes(leases_path(NODE_LEASE_NAMESPACE)),
        }

    # 2. a watch
    async def kubelet_watch(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The watch, and the same time without it: in alternating blocks of about 20 s, so
        that load from outside this benchmark falls on both alike. Returns the watch's figures
        and those of the spans without it (the idle rates every other figure is measured
        against)."""
        blocks = max(1, round(self.args.watch_s / 20))
        block_s = self.args.watch_s / blocks
        w, wo = Spent(), Spent()
        for _ in range(blocks):
            wo.add(await self._idle_block(block_s))
            w.add(await self._watch_block(block_s))
        encoding = await self.watch_encoding()
        return watch_figures(
            w, wo, blocks=blocks, watchers=self.args.watchers, encoding=encoding, pids=self.pids
        )

    async def _puts_since(self, m0: str) -> float:
        return request_count(await self.metrics(), "PUT", "leases") - request_count(m0, "PUT", "leases")

    async def _idle_block(self, span_s: float) -> Block:
        """``span_s`` without the watch."""
        m0 = await self.metrics()
        b0, t = bytes_read(), Ticks(self.pids)
        await asyncio.sleep(span_s)
        dt, by, own = t.stop()
        wire = bytes_read() - b0
        return dt, by, own, 0, wire, await self._puts_since(m0)

    async def _watch_block(self, span_s: float) -> Block:
        """One watch through the aggregator's Informer for ``span_s`` after its LIST: elapsed
        s, CPU ticks, this process's CPU s, events, bytes read."""
        seen = KubeletSeen()
        # Several watchers, when asked: kube-apiserver's cost per watcher is then that many times
        # larger than the noise a shared machine puts on its rate.
        informers = [
            Informer(
                self.client,
                leases_path(NODE_LEASE_NAMESPACE),
                name="kubelet-leases",
                parse=seen.parse,
                on_list=seen.on_list,
                on_event=seen.on_event,
            )
            for _ in range(self.args.watchers)
        ]
        tasks = [asyncio.create_task(i.run(), name="watch kubelet leases") for i in informers]
        try:
            for informer in informers:
                await asyncio.wait_for(informer.synced.wait(), 60)
            await asyncio.sleep(1)  # past the initial LIST's parse: the watch alone from here
            m0 = await self.metrics()
            seen.events = 0
            b0, t = bytes_read(), Ticks(self.pids)
            await asyncio.sleep(span_s)
            dt, by, own = t.stop()
            got, wire = seen.events, bytes_read() - b0
            puts = await self._puts_since(m0)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return dt, by, own, got, wire, puts

    async def watch_encoding(self) -> str:
        """The Content-Encoding KAPI gives a watch when gzip is allowed."""
        async with (
            self.raw(decompress=False) as s,
            s.get(
                self.plane.url + leases_path(NODE_LEASE_NAMESPACE),
                params={"watch": "true", "timeoutSeconds": "1"},
                headers={"Accept-Encoding": "gzip, deflate"},
            ) as r,
        ):
            await r.read()
            return r.headers.get("Content-Encoding", "") or "none"

    # 3. the sample's GETs
    async def sample_gets(self) -> dict[str, Any]:
        async def one(name: str) -> tuple[str, KubeletObs]:
            obj = await self.client.get(lease_path(NODE_LEASE_NAMESPACE, name))
            return name, KubeletObs(micro_time(section(obj, "spec").get("renewTime")), time.monotonic())

        calls = [functools.partial(one, x) for x in self.sample]

        async def read() -> None:
            got = dict(await gather_limited(calls, 16))
            assert len(got) == len(self.sample)

        out = await self.paired(read, self.args.lists)
        with self.writes_paused():
            paused = await self.paired(read, self.args.lists)
        return {
            "k": len(self.sample),
            **out,
            "paused": paused,
            "field_selector": await self.field_selectors(),
        }

    async def field_selectors(self) -> dict[str, str]:
        """What a fieldSelector on metadata.name gives for leases: one name, two names."""
        path = leases_path(NODE_LEASE_NAMESPACE)
        a, b = self.sample[0], self.sample[1]
        out = {}
        for label, selector in (
            ("metadata.name=A", f"metadata.name={a}"),
            ("metadata.name=A,metadata.name=B", f"metadata.name={a},metadata.name={b}"),
            ("metadata.name in (A,B)", f"metadata.name in ({a},{b})"),
        ):
            try:
                result = await self.client.get(path, fieldSelector=selector)
                out[label] = f"{len(result.get('items') or [])} item(s)"
            except ApiError as e:
                out[label] = f"{e.status} {e.reason}"
        return out

    # 4. the interlock
    async def interlock(self) -> dict[str, Any]:
        observed = Observed()
        agents = Informer(
            self.client,
            leases_path(DEFAULT_LEASE_NAMESPACE),
            name="leases",
            parse=LeaseView.from_object,
            on_list=observed.leases_listed,
            on_event=observed.lease_event,
        )
        kubelets = KubeletLeases(self.client)
        timeout_s = Watching().probe_timeout_s

        async def without() -> None:
            await self.client.probe(timeout_s=timeout_s)
            await agents.list_now()

        async def today() -> None:
            await self.client.probe(timeout_s=timeout_s)
            await agents.list_now()
            await kubelets.read()

        async def beside() -> None:
            await self.client.probe(timeout_s=timeout_s)
            await asyncio.gather(agents.list_now(), kubelets.read())

        ways = {"without the kubelets": without, "kubelets after (today)": today, "kubelets beside": beside}
        await today()
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(self.args.lists):
            for label, way in ways.items():  # interleaved: each sees the same load
                t0 = time.perf_counter()
                await way()
                times[label].append(time.perf_counter() - t0)
        return {
            k: {"p50_ms": round(quantile(v, 0.5) * 1000, 1), "p99_ms": round(quantile(v, 0.99) * 1000, 1)}
            for k, v in times.items()
        }

    # 5. Node objects
    async def create_nodes(self) -> dict[str, Any]:
        async def one(i: int) -> None:
            obj = node_object(i)
            created = await self.client.create("/api/v1/nodes", obj)
            if not section(created, "status").get("conditions"):
                created["status"] = obj["status"]
                await self.client.request(
                    "PUT", f"/api/v1/nodes/{obj['metadata']['name']}/status", body=created
                )

        t0 = time.monotonic()
        await gather_limited([functools.partial(one, i) for i in range(self.n)], 32)
        took = time.monotonic() - t0
        one_node = await self.sizes(f"/api/v1/nodes/{self.names[0]}")
        stored = await self.client.get(f"/api/v1/nodes/{self.names[0]}")
        return {
            "create_s": round(took, 1),
            "node_json_bytes": one_node["json_bytes"],
            "conditions": len(section(stored, "status").get("conditions") or []),
            "images": len(section(stored, "status").get("images") or []),
            "managed_fields_bytes": len(
                json.dumps(metadata(stored).get("managedFields"), separators=(",", ":"))
            ),
        }

    async def node_lists(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, accept in (("full", None), ("metadata only", METADATA_LIST)):

            async def list_nodes(accept: str | None = accept) -> list[NodeView]:
                # What Informer.list_now does for nodes: one LIST, every item parsed.
                result = await self.client.request("GET", "/api/v1/nodes", accept=accept)
                return [NodeView.from_object(o) for o in result["items"]]

            views = await list_nodes()
            assert len(views) == self.n
            out[label] = {
                **await self.paired(list_nodes, self.args.node_lists),
                **await self.sizes("/api/v1/nodes", accept or "application/json"),
                **await self.held(accept),
            }
        return out

    async def held(self, accept: str | None) -> dict[str, float]:
        """Memory (tracemalloc) of the LIST's items as parsed JSON, and of their NodeViews alone."""
        async with (
            self.raw(decompress=True) as s,
            s.get(self.plane.url + "/api/v1/nodes", headers={"Accept": accept or "application/json"}) as r,
        ):
            payload = await r.read()
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            items = json.loads(payload)["items"]
            raw = tracemalloc.get_traced_memory()[0] - base
            views = [NodeView.from_object(o) for o in items]
            del items
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
            assert len(views) == self.n
        finally:
            tracemalloc.stop()
        return {"raw_mib": round(raw / 2**20, 1), "views_mib": round(held / 2**20, 2)}


def request_count(text: str, verb: str, resource: str) -> float:
    """apiserver_request_total for one verb and resource, summed over its other labels."""
    return requests(parse_metrics(text, [REQUESTS]), verb, resource)


def served_from(before: str, after: str, resource: str, lists: int) -> str:
    """Objects per LIST that the watch cache and etcd gave between two scrapes of /metrics (a
    consistent LIST from the cache first reads etcd's revision: one LIST of limit 1)."""

    cache_name = "apiserver_cache_list_returned_objects_total"
    etcd_name = "apiserver_storage_list_fetched_objects_total"
    s0, s1 = parse_metrics(before, [cache_name, etcd_name]), parse_metrics(after, [cache_name, etcd_name])

    def per_list(name: str) -> float:
        return (resource_total(s1, name, resource) - resource_total(s0, name, resource)) / lists

    cache = per_list(cache_name)
    etcd = per_list(etcd_name)
    return f"objects per LIST from the watch cache {cache:g}, from etcd {etcd:g}"


async def measure(plane: ControlPlane, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    b = Bench(plane, args)
    r = b.r
    await b.create_agent_leases()
    stats = tmp / "writer.jsonl"
    with writer_process(plane, b.n, args.interval_s, stats, tmp / "writer.log") as writer:
        b.pids["writer"] = writer.pid
        t0 = time.monotonic()
        while not any(x.get("ready") for x in writer_stats(stats)):
            if not writer.alive():
                raise RuntimeError(f"the writer exited: {writer.tail()}")
            if time.monotonic() - t0 > 300:
                raise RuntimeError("the writer did not create its leases within 300 s")
            await asyncio.sleep(0.5)
        await asyncio.sleep(10)  # every lease renewed once: the watch cache and etcd at their pace
        since = writer_clock(stats)
        r["watch"], r["without_reads"] = await b.kubelet_watch()
        r["watch"].update(writer_rate(stats, since))
        since = writer_clock(stats)
        r["list"] = await b.kubelet_list()
        r["sample"] = await b.sample_gets()
        r["interlock"] = await b.interlock()
        r["list"].update(writer_rate(stats, since))
        r["load_after_leases"] = load_average()
    del b.pids["writer"]
    if not args.no_node_objects:
        await asyncio.sleep(2)
        r["node_objects"] = await b.create_nodes()
        r["node_lists"] = await b.node_lists()
    r["load_after"] = load_average()
    await b.client.close()
    return r


# -- tables


def _kib(n: float) -> str:
    return f"{n / 1024:,.0f} KiB"


def watch_kapi_pct(w: Mapping[str, Any], events_per_s: float) -> float:
    """kube-apiserver's CPU for one watcher at ``events_per_s``, in % of a core: its CPU per
    lease write with the watch minus without, per event."""
    per_write_s = (w["kube-apiserver_ms_per_write_with"] - w["kube-apiserver_ms_per_write_without"]) / 1000
    per_write_s /= w.get("watchers", 1)
    return float(per_write_s * events_per_s * 100)


def hourly(r: Mapping[str, Any]) -> dict[str, Cost]:
    li, w, s = r["list"], r["watch"], r["sample"]
    mib, agg = li["wire_bytes"] / 2**20, li["aggregator_cpu_ms"] / 1000
    kapi = li["paused"]["kapi_cpu_ms"] / 1000
    real = r["nodes"] / kubelet_writer.KUBELET_RENEW_INTERVAL_S
    k = scale_to(w["events_per_s"], real)
    return {
        "list": per_hour_polled(WITNESS_EVERY_S, mib, agg, kapi),
        "watch": per_hour_watched(
            k * w["events_per_s"],
            k * w["wire_bytes_per_s"],
            k * (w["aggregator_cpu_pct"] - w["aggregator_cpu_pct_without"]),
            watch_kapi_pct(w, real),
        ),
        "sample": per_hour_polled(
            WITNESS_EVERY_S,
            s["wire_bytes"] / 2**20,
            s["aggregator_cpu_ms"] / 1000,
            s["paused"]["kapi_cpu_ms"] / 1000,
            s["k"],
        ),
    }


def _writes(label: str, x: Mapping[str, Any]) -> list[object]:
    return [label, x["writes_per_s"], x["errors"], x["skipped"], x["max_waiting"], f"{x['max_p99_ms']} ms"]


def _print_writes(r: Mapping[str, Any]) -> None:
    n, w, li = r["nodes"], r["watch"], r["list"]
    print(
        f"\n{n} kubelet leases renewed by PUT every {r['args']['interval_s']:g} s "
        f"(wanted {n / r['args']['interval_s']:g}/s). Load average "
        f"{r['load_before']} at the start, {r['load_after_leases']} after the leases, "
        f"{r['load_after']} at the end."
    )
    print_table(
        f"{n} kubelet leases: the writes behind every figure (the writer in its own process)",
        [
            "span",
            "renewals answered/s",
            "errors",
            "skipped (in flight)",
            "worst backlog",
            "worst p99 of a second",
        ],
        [
            _writes(f"watch and no watch, {w['blocks']} blocks each", w),
            _writes("the LISTs, GETs and interlocks", li),
        ],
    )


READ_HEADER = (
    "read",
    "p50 / p99 under writes",
    "p50 writes paused",
    "read from the socket",
    "aggregator CPU",
    "kube-apiserver CPU",
    "etcd CPU",
)


def _read_row(label: str, x: Mapping[str, Any], wire: str) -> list[object]:
    return [
        label,
        f"{x['p50_ms']} / {x['p99_ms']} ms",
        f"{x['paused']['p50_ms']} ms",
        wire,
        f"{x['aggregator_cpu_ms']} ms",
        f"{x['paused']['kapi_cpu_ms']} ms",
        f"{x['paused']['etcd_cpu_ms']} ms",
    ]


def _print_reads(r: Mapping[str, Any]) -> None:
    n, li, s = r["nodes"], r["list"], r["sample"]
    print_table(
        f"One read of the kubelet leases at {n} ({r['args']['lists']} each; kube-apiserver and etcd CPU "
        "above an equal span without reads, with the writes paused)",
        READ_HEADER,
        [
            _read_row(
                f"LIST kube-node-lease, {li['items']} items",
                li,
                f"{_kib(li['wire_bytes'])} ({li['encoding'] or 'no'} encoding)",
            ),
            _read_row(f"GET the sample's {s['k']} by name, 16 at a time", s, _kib(s["wire_bytes"])),
        ],
    )
    print(
        f"Under writes, kube-apiserver CPU above its rate without reads: LIST {li['kapi_cpu_ms']} ms, "
        f"GETs {s['kapi_cpu_ms']} ms (noise: its rate moves with the write rate the machine allows)."
    )
    print(f"\nThe LIST: JSON {_kib(li['json_bytes'])}; {li['served']}.")
    print_table(
        "fieldSelector on metadata.name for leases",
        ["selector", "answer"],
        [[k, v] for k, v in s["field_selector"].items()],
    )


def _watch_rows(w: Mapping[str, Any]) -> list[list[object]]:
    return [
        ["events/s received per watcher", w["events_per_s"], "-"],
        [
            "bytes/s read from the socket per watcher",
            f"{w['wire_bytes_per_s']:,} ({w['bytes_per_event']} per event; encoding {w['watch_encoding']})",
            "-",
        ],
        [
            "aggregator CPU per watcher",
            f"{w['aggregator_cpu_pct']} % ({w['aggregator_us_per_event']} µs per event)",
            f"{w['aggregator_cpu_pct_without']} %",
        ],
        ["lease PUTs/s served", w["writes_per_s_with"], w["writes_per_s_without"]],
        *[
            [f"{p} CPU", f"{w[p + '_cpu_pct']} %", f"{w[p + '_cpu_pct_without']} %"]
            for p in ("kube-apiserver", "etcd", "writer")
        ],
        *[
            [
                f"{p} CPU per lease PUT",
                f"{w[p + '_ms_per_write_with']} ms",
                f"{w[p + '_ms_per_write_without']} ms",
            ]
            for p in ("kube-apiserver", "etcd")
        ],
    ]


def _print_watch(r: Mapping[str, Any]) -> None:
    n, wo, w = r["nodes"], r["without_reads"], r["watch"]
    print_table(
        f"{w['watchers']} watch(es) of kube-node-lease at {w['writes_per_s']} writes/s: "
        f"{w['span_s']} s with, "
        f"{wo['span_s']} s without (Informer, 10 s re-watch; {w['blocks']} alternating blocks)",
        ["measure", "with the watch", "without"],
        _watch_rows(w),
    )
    real = n / kubelet_writer.KUBELET_RENEW_INTERVAL_S
    print(
        f"kube-apiserver's CPU for one watcher, per event and at {real:g} events/s: "
        f"{watch_kapi_pct(w, real):.1f} % of a core."
    )
    k = scale_to(w["events_per_s"], real)
    if k != 1.0:
        print(
            f"EXTRAPOLATED to kubelet's {real:g} events/s (x{k:.2f}, per event, linearly): "
            f"{k * w['wire_bytes_per_s']:,.0f} bytes/s, aggregator "
            f"{k * (w['aggregator_cpu_pct'] - w['aggregator_cpu_pct_without']):.1f} %. "
            "The watch row below is scaled so."
        )


def _print_hourly(r: Mapping[str, Any]) -> None:
    h = hourly(r)
    rows = []
    for label, cost, healthy in (
        ("LIST every 10 s while not healthy (today)", h["list"], "0"),
        (f"GET the sample's {r['sample']['k']} every 10 s while not healthy", h["sample"], "0"),
        ("watch always", h["watch"], None),
    ):
        line = (
            f"{cost.requests:,.0f} req, {cost.mib:,.0f} MiB, aggregator {cost.aggregator_cpu_s:,.0f} s, "
            f"KAPI {cost.kapi_cpu_s:,.0f} s"
        )
        rows.append([label, healthy if healthy is not None else line, line])
    print_table(
        f"Cost per hour at {r['nodes']} nodes (CPU in core-seconds, from the figures above)",
        ["way", "hour healthy", "hour not healthy (confirming, scaled down)"],
        rows,
    )


def _print_interlock(r: Mapping[str, Any]) -> None:
    n, it = r["nodes"], r["interlock"]
    print_table(
        f"The interlock's reads right before a scale-down at {n} nodes ({r['args']['lists']} each)",
        ["reads", "p50", "p99"],
        [
            [f"probe + LIST {n} agent leases{extra}", f"{v['p50_ms']} ms", f"{v['p99_ms']} ms"]
            for extra, v in (
                ("", it["without the kubelets"]),
                (f", then LIST {n} kubelet leases (today)", it["kubelets after (today)"]),
                (f", LIST {n} kubelet leases beside it", it["kubelets beside"]),
            )
        ],
    )


NODE_LIST_HEADER = (
    "as",
    "p50",
    "p99",
    "read from the socket",
    "JSON",
    "aggregator CPU",
    "kube-apiserver CPU",
    "items held as parsed JSON",
    "NodeViews held",
)


def _print_node_lists(r: Mapping[str, Any]) -> None:
    n, no, nl = r["nodes"], r["node_objects"], r["node_lists"]
    print(
        f"\n{n} Node objects of {no['node_json_bytes']:,} bytes of JSON each ({no['conditions']} "
        f"conditions, {no['images']} images; managedFields {no['managed_fields_bytes']:,} bytes), "
        f"created in {no['create_s']} s. The kubelet writer stopped."
    )
    print_table(
        f"LIST {n} Nodes into NodeView ({r['args']['node_lists']} each)",
        NODE_LIST_HEADER,
        [
            [
                label,
                f"{v['p50_ms']} ms",
                f"{v['p99_ms']} ms",
                f"{_kib(v['wire_bytes'])} ({v['encoding'] or 'no'} encoding)",
                _kib(v["json_bytes"]),
                f"{v['aggregator_cpu_ms']} ms",
                f"{v['kapi_cpu_ms']} ms",
                f"{v['raw_mib']} MiB",
                f"{v['views_mib']} MiB",
            ]
            for label, v in nl.items()
        ],
    )


def print_results(r: Mapping[str, Any]) -> None:
    _print_writes(r)
    _print_reads(r)
    _print_watch(r)
    _print_hourly(r)
    _print_interlock(r)
    if "node_objects" in r:
        _print_node_lists(r)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.witness_cost")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument(
        "--interval-s",
        type=float,
        default=kubelet_writer.KUBELET_RENEW_INTERVAL_S,
        help="each kubelet lease renewed this often (kubelet: 10 s); longer where the machine cannot keep up",
    )
    parser.add_argument("--watch-s", type=float, default=60.0, help="the watch, and the span without it")
    parser.add_argument("--lists", type=int, default=20, help="LISTs, sample reads and interlocks each")
    parser.add_argument(
        "--watchers", type=int, default=1, help="watches at once (kube-apiserver's cost per watcher)"
    )
    parser.add_argument("--node-lists", type=int, default=5, help="Node LISTs each way")
    parser.add_argument("--no-node-objects", action="store_true")
    parser.add_argument("--out", default="/tmp/witness-cost.json")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    with (
        ControlPlane().running() as plane,
        tempfile.TemporaryDirectory(prefix="dwd-witness-") as tmp,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        r = runner.run(measure(plane, args, Path(tmp)))
    r["args"] = vars(args)
    r["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    r["took_s"] = round(time.monotonic() - t0)
    print_results(r)
    print(f"\n{r['took_s']} s; raw numbers: {args.out}")
    Path(args.out).write_text(json.dumps(r, indent=1, default=str))


if __name__ == "__main__":
    main()
