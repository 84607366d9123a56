"""What reading the Nodes in full costs against metadata only, at 5000 nodes, on a real
kube-apiserver: dependency-watchdog's unhealthy-condition and in-place-update rules need each
Node's status, so the aggregator watches full objects unless DWD_NODE_CONDITIONS=off.

Nodes are shaped like a kubelet's (labels, addresses, capacity, nodeInfo, the standard and
node-problem-detector conditions, 30 images): about 8 KB of JSON each. Measured: one LIST
each way (bytes, time to the last byte, the aggregator's parse into NodeViews), then a watch
each way, side by side, while every node's status is updated once as a kubelet's heartbeat
would (bytes a watch carries, the aggregator's cost per event). Parse times are the median
of three LISTs; the peak is Python's allocation (tracemalloc) while one body is parsed.
A metadata-only watch still gets an event for every status update: the event count is the
same, the bytes are not.

``python -m bench.node_objects [nodes]``
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from aggregator.kube import METADATA_LIST, METADATA_ONLY
from aggregator.objects import NodeView
from aggregator.watcher import NODE_PAGE, Observed
from bench.table import print_table
from testenv.client import Client
from testenv.controlplane import ControlPlane

NODES = "/api/v1/nodes"
FULL = "application/json"
THREADS = 8

CONDITIONS = (
    ("KernelDeadlock", "False"),
    ("ReadonlyFilesystem", "False"),
    ("FrequentKubeletRestart", "False"),
    ("FrequentContainerdRestart", "False"),
    ("CorruptDockerOverlay2", "False"),
    ("NetworkUnavailable", "False"),
    ("MemoryPressure", "False"),
    ("DiskPressure", "False"),
    ("PIDPressure", "False"),
    ("Ready", "True"),
)


def _conditions(when: str) -> list[dict[str, str]]:
    return [
        {
            "type": kind,
            "status": status,
            "lastHeartbeatTime": when,
            "lastTransitionTime": "2026-11-01T00:00:00Z",
            "reason": f"{kind}Checked",
            "message": f"the node's {kind} check passed",
        }
        for kind, status in CONDITIONS
    ]


NODE_INFO = {
    "kernelVersion": "6.6.0-gardenlinux-cloud-amd64",
    "osImage": "Garden Linux 1592.3",
    "containerRuntimeVersion": "containerd://1.7.20",
    "kubeletVersion": "v1.35.4",
    "kubeProxyVersion": "v1.35.4",
    "operatingSystem": "linux",
    "architecture": "amd64",
}
IMAGES = [
    {
        "names": [
            f"europe-docker.pkg.dev/gardener-project/releases/component-{j}@sha256:{j:064x}",
            f"europe-docker.pkg.dev/gardener-project/releases/component-{j}:v1.{j}.0",
        ],
        "sizeBytes": 10_000_000 + j,
    }
    for j in range(30)
]


def _labels(name: str, i: int) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "m5.large",
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": f"eu-west-1{'abc'[i % 3]}",
        "worker.gardener.cloud/pool": "worker-a",
        "worker.garden.sapcloud.io/group": "worker-a",
        "node.kubernetes.io/role": "node",
    }


def _status(name: str, i: int) -> dict[str, Any]:
    return {
        "capacity": {"cpu": "2", "memory": "8000000Ki", "pods": "110", "ephemeral-storage": "50000000Ki"},
        "allocatable": {
            "cpu": "1920m",
            "memory": "6800000Ki",
            "pods": "110",
            "ephemeral-storage": "48000000Ki",
        },
        "conditions": _conditions("2026-12-01T00:00:00Z"),
        "addresses": [
            {"type": "InternalIP", "address": f"10.250.{i // 256 % 256}.{i % 256}"},
            {"type": "Hostname", "address": name},
            {"type": "InternalDNS", "address": f"{name}.eu-west-1.compute.internal"},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:032x}", "bootID": f"{i:032x}", **NODE_INFO},
        "images": [dict(x) for x in IMAGES],
    }


def node(i: int) -> dict[str, Any]:
    name = f"node-{i:05d}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": _labels(name, i),
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "checksum/cloud-config-data": f"{i:064x}",
            },
        },
        "spec": {
            "podCIDR": f"100.{64 + i // 256 % 64}.{i % 256}.0/24",
            "providerID": f"aws:///eu-west-1a/i-{i:017x}",
        },
        "status": _status(name, i),
    }


def _clients(cp: ControlPlane) -> list[Client]:
    """One for each writer thread, and one for each of the two watches."""
    return [cp.admin_client() for _ in range(THREADS + 2)]


def _each(clients: list[Client], n: int, work: Any) -> None:
    def part(k: int) -> None:
        for i in range(k, n, THREADS):
            work(clients[k], i)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(part, range(THREADS)))


def _list(c: Client, accept: str) -> tuple[bytes, float, float, str]:
    """The body, seconds to the last byte, seconds to parse into NodeViews, resourceVersion."""
    t0 = time.perf_counter()
    response = c.http.get(NODES, headers={"Accept": accept})
    took = time.perf_counter() - t0
    response.raise_for_status()
    t0 = time.perf_counter()
    body = json.loads(response.content)
    views = [NodeView.from_object(o) for o in body["items"]]
    parse = time.perf_counter() - t0
    assert views
    return response.content, took, parse, str(body["metadata"]["resourceVersion"])


def _peak_mib(pages: list[bytes]) -> float:
    """The aggregator's peak allocation while LIST bodies become NodeViews (the bodies not
    counted): a page's decoded objects live until its last view is made."""
    tracemalloc.start()
    views: list[NodeView] = []
    for content in pages:
        body = json.loads(content)
        views.extend(NodeView.from_object(o) for o in body["items"])
        del body
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert views
    return peak / 2**20


def _paged(c: Client, limit: int) -> tuple[list[bytes], float, float]:
    """A LIST of full nodes in pages, as the aggregator's node informer makes it: the bodies,
    seconds to the last byte of the last page, seconds to parse every page."""
    pages, params, took, parse = [], {"limit": str(limit)}, 0.0, 0.0
    while True:
        t0 = time.perf_counter()
        response = c.http.get(NODES, params=params, headers={"Accept": FULL})
        took += time.perf_counter() - t0
        response.raise_for_status()
        pages.append(response.content)
        t0 = time.perf_counter()
        body = json.loads(response.content)
        assert all(NodeView.from_object(o) for o in body["items"])
        parse += time.perf_counter() - t0
        token = body["metadata"].get("continue")
        if not token:
            return pages, took, parse
        params = {"limit": str(limit), "continue": token}


class _Watch(threading.Thread):
    """Reads a watch until ``events`` non-bookmark events have arrived; keeps the lines."""

    def __init__(self, c: Client, accept: str, rv: str, events: int) -> None:
        super().__init__(daemon=True)
        self.c, self.accept, self.rv, self.events = c, accept, rv, events
        self.lines: list[bytes] = []
        self.open = threading.Event()

    def run(self) -> None:
        params = {"watch": "1", "resourceVersion": self.rv, "timeoutSeconds": "300"}
        with self.c.http.stream("GET", NODES, params=params, headers={"Accept": self.accept}) as r:
            self.open.set()
            for line in r.iter_lines():
                if line:
                    self.lines.append(line.encode())
                    if len(self.lines) >= self.events:
                        return


def _per_event_us(lines: list[bytes]) -> float:
    observed = Observed(clock=lambda: 0.0)
    t0 = time.perf_counter()
    for line in lines:
        event = json.loads(line)
        observed.node_event(event["type"], NodeView.from_object(event["object"]))
    return (time.perf_counter() - t0) / len(lines) * 1e6


def _list_rows(c: Client, n: int) -> tuple[list[list[object]], str]:
    """Three LISTs each way, and one of full nodes in the aggregator's pages; the full LIST's
    resourceVersion for the watches."""
    rows: list[list[object]] = []
    lists = {}
    for label, accept in (("full", FULL), ("metadata only", METADATA_LIST)):
        runs = [_list(c, accept) for _ in range(3)]
        lists[label] = runs[-1][3]
        rows.append(
            [
                f"LIST of {n} nodes, {label}",
                f"{len(runs[-1][0]) / 2**20:.1f} MiB",
                f"{statistics.median(r[1] for r in runs) * 1000:.0f} ms",
                f"{statistics.median(r[2] for r in runs) * 1000:.0f} ms, "
                f"peak {_peak_mib([runs[-1][0]]):.0f} MiB",
            ]
        )
    paged = [_paged(c, NODE_PAGE) for _ in range(3)]
    rows.append(
        [
            f"LIST of {n} nodes, full, in pages of {NODE_PAGE} (the aggregator's)",
            f"{sum(map(len, paged[-1][0])) / 2**20:.1f} MiB in {len(paged[-1][0])} pages",
            f"{statistics.median(p[1] for p in paged) * 1000:.0f} ms",
            f"{statistics.median(p[2] for p in paged) * 1000:.0f} ms, peak {_peak_mib(paged[-1][0]):.0f} MiB",
        ]
    )
    return rows, lists["full"]


def _watch_rows(clients: list[Client], n: int, rv: str) -> tuple[list[list[object]], float]:
    """A watch each way from ``rv`` while every node's status is updated once; the rows and
    the seconds the updates took."""
    watches = {
        "full": _Watch(clients[THREADS], FULL, rv, n),
        "metadata only": _Watch(clients[THREADS + 1], METADATA_ONLY, rv, n),
    }
    for w in watches.values():
        w.start()
        w.open.wait(10)
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.perf_counter()
    _each(
        clients,
        n,
        lambda c, i: c.merge_patch(
            f"{NODES}/node-{i:05d}/status", {"status": {"conditions": _conditions(when)}}
        ),
    )
    updates_s = time.perf_counter() - t0
    for w in watches.values():
        w.join(120)
    rows: list[list[object]] = []
    for label, w in watches.items():
        got, total = len(w.lines), sum(map(len, w.lines))
        rows.append(
            [
                f"watch, {got} status updates, {label}",
                f"{total / 2**20:.1f} MiB ({total / max(got, 1) / 1024:.1f} KiB an event)",
                "",
                f"{_per_event_us(w.lines):.0f} µs an event",
            ]
        )
    return rows, updates_s


def run(n: int = 5000) -> None:
    with ControlPlane().running() as cp:
        clients = _clients(cp)
        t0 = time.perf_counter()
        _each(clients, n, lambda c, i: c.create(NODES, node(i)))
        created_s = time.perf_counter() - t0
        size = len(json.dumps(node(0)))
        rows, rv = _list_rows(clients[0], n)
        watched, updates_s = _watch_rows(clients, n, rv)
        for c in clients:
            c.close()

    print_table(
        f"Nodes in full or as metadata only, {n} nodes of {size / 1024:.1f} KiB "
        f"(created in {created_s:.0f} s, updated in {updates_s:.0f} s)",
        ["read", "bytes", "to the last byte", "aggregator's parse"],
        rows + watched,
    )


if __name__ == "__main__":
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
