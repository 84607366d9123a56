"""Where the leases live: what a 5000-node shoot's LISTs cost with ours in kube-system (where they
are) and with ours in kube-node-lease (beside the kubelets' heartbeats), on a real API server.

Two reads matter: the aggregator's LIST of its own leases (by label: the namespace is shared
either way) and the second witness's LIST of the kubelets' leases in kube-node-lease, which in
the second layout has to leave ours out by label too. Each is timed five times; the median.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from bench.tools.table import print_table
from core.lease import (
    LEASE_LABEL,
    LEASE_SELECTOR,
    format_micro_time,
    lease_metadata,
    leases_path,
)
from testenv.base.kapi import Client
from testenv.kube.controlplane import ControlPlane

NODES = 5000
KUBELETS = "kube-node-lease"
REPEAT = 5


def _create(cp: ControlPlane, namespace: str, bodies: list[dict[str, Any]]) -> None:
    def chunk(part: list[dict[str, Any]]) -> None:
        with cp.admin_client() as c:
            for body in part:
                c.create(leases_path(namespace), body)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(chunk, [bodies[i::4] for i in range(4)]))


def _timed(c: Client, namespace: str, selector: str) -> tuple[float, int, int]:
    """Median milliseconds, the bytes of one answer, its items."""
    took = []
    size = items = 0
    for _ in range(REPEAT):
        started = time.perf_counter()
        response = c.http.get(
            leases_path(namespace), params={"labelSelector": selector} if selector else None
        )
        took.append((time.perf_counter() - started) * 1000)
        size, items = len(response.content), len(response.json()["items"])
    return statistics.median(took), size, items


def run() -> None:
    now = format_micro_time(datetime.now(UTC))
    nodes = [f"node-{i:04d}" for i in range(NODES)]
    kubelet = [
        {"metadata": {"name": n}, "spec": {"holderIdentity": n, "leaseDurationSeconds": 40, "renewTime": now}}
        for n in nodes
    ]
    ours = [
        {
            "metadata": {
                **lease_metadata(n),
                "annotations": {"dependency-watchdog.gardener.cloud/renew-interval": "2s"},
            },
            "spec": {"holderIdentity": n, "leaseDurationSeconds": 8, "renewTime": now},
        }
        for n in nodes
    ]
    rows = []
    with ControlPlane().running() as cp, cp.admin_client() as c:
        _create(cp, KUBELETS, kubelet)
        _create(cp, "kube-system", ours)
        rows.append(("kube-system", *_row(c, "kube-system", "")))
        _create(cp, KUBELETS, ours)
        rows.append(("kube-node-lease", *_row(c, KUBELETS, "!" + LEASE_LABEL)))
    print_table(
        f"The LISTs of a {NODES}-node shoot by where our leases live (median of {REPEAT})",
        ("our leases in", "ours: ms", "KiB", "items", "kubelets': ms", "KiB", "items"),
        rows,
    )


def _row(c: Client, ours_in: str, kubelet_selector: str) -> tuple[object, ...]:
    ms, size, items = _timed(c, ours_in, LEASE_SELECTOR)
    kms, ksize, kitems = _timed(c, KUBELETS, kubelet_selector)
    return f"{ms:.0f}", size // 1024, items, f"{kms:.0f}", ksize // 1024, kitems


if __name__ == "__main__":
    run()
