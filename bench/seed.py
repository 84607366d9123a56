"""One aggregator, a whole seed of targets: what it asks of the seed's API server while nothing
changes, and what it costs itself.

Real seed and shoot kube-apiservers; per target a control-plane namespace with a Cluster of a
real one's size (25 KB), the kubeconfig Secret and the three dependents. The targets share
the shoot and it has no nodes: the part measured here, the seed side of a target, does not
depend on them. The aggregator (``DWD_TARGETS=gardener``, its defaults otherwise) runs as its
own process, from this tree or from another (``--code DIR``: an older checkout, for a before
and after). Its seed requests are counted from the seed API server's
``apiserver_request_total`` over a window once every target judges; nobody else writes to the
seed meanwhile. ``python -m bench.seed --targets 50,250``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from bench.table import print_table
from core.lease import DEFAULT_LEASE_NAMESPACE
from testenv.apply import RESOURCES, apply, load_docs
from testenv.client import Client
from testenv.controlplane import ControlPlane, ensure_namespace, free_port
from testenv.gardener import CLUSTER_CRD, cluster
from testenv.standins import CONTROLLERS, DEPLOYMENTS, deployment, wait_for

ROOT = Path(__file__).resolve().parents[1]
SHOOT_ACCESS = ROOT / "manifests" / "shoot-access" / "rbac.yaml"
SECRET = "shoot-access-dwd-lease-aggregator"
MACHINE_TYPES = 200  # a Cluster of ~25 KB


def access_kubeconfig(shoot: ControlPlane) -> str:
    """A token kubeconfig for the aggregator's service account in the shoot."""
    with shoot.admin_client() as admin:
        ensure_namespace(admin, DEFAULT_LEASE_NAMESPACE)
        apply(admin, load_docs(SHOOT_ACCESS.read_text()))
        token = admin.create(
            "/api/v1/namespaces/kube-system/serviceaccounts/dwd-lease-aggregator/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 7200},
            },
        )["status"]["token"]
    ca = base64.b64encode(shoot.ca_file.read_bytes()).decode()
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "shoot",
            "clusters": [
                {"name": "shoot", "cluster": {"server": shoot.url, "certificate-authority-data": ca}}
            ],
            "contexts": [{"name": "shoot", "context": {"cluster": "shoot", "user": "aggregator"}}],
            "users": [{"name": "aggregator", "user": {"token": token}}],
        }
    )


def populate(seed: Client, targets: int, kubeconfig: str) -> None:
    RESOURCES.setdefault("Cluster", ("clusters", False))
    apply(seed, [CLUSTER_CRD])
    wait_for(lambda: _served(seed), 30, "the Cluster CRD")
    data = {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}
    for i in range(targets):
        ns = f"shoot--bench--s{i:03d}"
        ensure_namespace(seed, ns)
        seed.ensure(f"/api/v1/namespaces/{ns}/secrets", {"metadata": {"name": SECRET}, "data": data})
        for name, replicas in CONTROLLERS.items():
            seed.ensure(DEPLOYMENTS.format(ns=ns), deployment(name, replicas))
        seed.ensure(
            "/apis/extensions.gardener.cloud/v1alpha1/clusters", cluster(ns, machine_types=MACHINE_TYPES)
        )


def _served(seed: Client) -> bool:
    with contextlib.suppress(Exception):
        seed.get("/apis/extensions.gardener.cloud/v1alpha1/clusters")
        return True
    return False


def requests_by_kind(seed: Client) -> Counter[tuple[str, str]]:
    """The seed API server's request counters by verb and resource (not /metrics itself)."""
    text = seed.http.get("/metrics").text
    out: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        fields = dict(kv.split("=", 1) for kv in labels[len("apiserver_request_total{") : -1].split(","))
        resource = fields.get("resource", '""').strip('"')
        if not resource:
            continue  # non-resource URLs: /metrics, /readyz
        sub = fields.get("subresource", '""').strip('"')
        out[(fields["verb"].strip('"'), resource + (f"/{sub}" if sub else ""))] += int(float(value))
    return out


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
        out: dict[str, Any] = json.load(r)
        return out


@contextlib.contextmanager
def aggregator(seed: ControlPlane, code: Path, tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(code),
        "PYTHONSAFEPATH": "1",
        "DWD_TARGETS": "gardener",
        "DWD_SEED_KUBECONFIG": str(seed.kubeconfig),
        "DWD_METRICS_ADDR": f"127.0.0.1:{port}",
        "DWD_LOG_FORMAT": "json",
    }
    with open(tmp / "aggregator.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aggregator"], env=env, stdout=log, stderr=log, cwd=tmp
        )
    try:
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def measure(targets: int, code: Path, window_s: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dwd-bench-seed-"))
    with ControlPlane().running() as seed, ControlPlane().running() as shoot, seed.admin_client() as admin:
        populate(admin, targets, access_kubeconfig(shoot))
        started = time.monotonic()
        with aggregator(seed, code, tmp) as (proc, port):

            def judging() -> bool:
                with contextlib.suppress(OSError, ValueError):
                    ts = status(port)["targets"]
                    return len(ts) == targets and all(t["phase"] == "healthy" for t in ts)
                return False

            wait_for(judging, 300, f"{targets} targets judging", every_s=1.0)
            ready_s = time.monotonic() - started
            time.sleep(5)  # past the start's own reads
            before, cpu_before = requests_by_kind(admin), cpu_s(proc.pid)
            time.sleep(window_s)
            after, cpu_after = requests_by_kind(admin), cpu_s(proc.pid)
            snap = status(port)
            rss = rss_mib(proc.pid)
    rates = {k: (after[k] - before[k]) / window_s for k in after if after[k] > before[k]}
    return {
        "ready_s": ready_s,
        "cpu_pct": 100 * (cpu_after - cpu_before) / window_s,
        "rss_mib": rss,
        "rates": rates,
        "loop_lag": snap.get("loop_lag", {}),
    }


def run(sizes: list[int], code: Path, window_s: float, label: str) -> None:
    rows = []
    for n in sizes:
        m = measure(n, code, window_s)
        by_kind = ", ".join(f"{v} {r} {rate:.2f}/s" for (v, r), rate in sorted(m["rates"].items()))
        lag = m["loop_lag"]
        rows.append(
            [
                n,
                f"{m['ready_s']:.0f} s",
                f"{sum(m['rates'].values()):.2f}",
                by_kind or "none",
                f"{m['cpu_pct']:.1f} %",
                f"{m['rss_mib']:.0f} MiB",
                f"{lag.get('p99_s', 0) * 1000:.0f} ms" if lag else "-",
            ]
        )
    print_table(
        f"One aggregator, a seed of targets, healthy ({label}; window {window_s:.0f} s)",
        [
            "targets",
            "start -> all judging",
            "seed req/s",
            "by verb and resource",
            "CPU",
            "RSS",
            "loop lag p99",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.seed")
    p.add_argument("--targets", default="50", help="comma-separated target counts")
    p.add_argument("--window", type=float, default=60.0, help="seconds of healthy state measured")
    p.add_argument("--code", type=Path, default=ROOT, help="the tree the aggregator runs from")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.targets.split(",")]
    run(
        sizes,
        args.code.resolve(),
        args.window,
        "this tree" if args.code.resolve() == ROOT else str(args.code),
    )


if __name__ == "__main__":
    main()
