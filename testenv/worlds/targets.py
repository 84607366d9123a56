"""A seed of Gardener targets on one shoot, for the aggregator's gardener mode at scale
(``bench.seed``): per target a control-plane namespace with a Cluster of a real one's size,
the shoot's access Secret and the three dependents; the aggregators that serve them."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path

import yaml

from core.lease import DEFAULT_LEASE_NAMESPACE
from testenv.base.kapi import Client
from testenv.base.process import Process, stop_all
from testenv.base.wait import wait_for
from testenv.gardener.apply import apply, load_docs
from testenv.gardener.seed_objects import CLUSTER_CRD, CLUSTERS_PATH, cluster
from testenv.kube.controllers import CONTROLLERS
from testenv.kube.controlplane import ControlPlane, ensure_namespace, free_port
from testenv.kube.standins import DEPLOYMENTS, deployment
from testenv.worlds.aggregators import FromSource, start_aggregator
from testenv.worlds.shoot_world import ACCESS_SECRET, AGGREGATOR_RBAC

MACHINE_TYPES = 200  # a Cluster of ~25 KB
SHOOT_USER = "system:serviceaccount:kube-system:dwd-lease-aggregator"


def namespace(i: int) -> str:
    return f"shoot--bench--s{i:03d}"


def access_kubeconfig(shoot: ControlPlane) -> str:
    """A token kubeconfig for the aggregator's service account in the shoot (SHOOT_USER), its
    credentials as data, as a Secret's must be."""
    with shoot.admin_client() as admin:
        ensure_namespace(admin, DEFAULT_LEASE_NAMESPACE)
        apply(admin, load_docs(AGGREGATOR_RBAC.read_text()))
        token = admin.create(
            "/api/v1/namespaces/kube-system/serviceaccounts/dwd-lease-aggregator/token",
            # Two hours: past a run of every size, whose shoot is fresh.
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 7200},
            },
        )["status"]["token"]
    ca = base64.b64encode(shoot.ca_file.read_bytes()).decode()
    cluster_ = {"server": shoot.url, "certificate-authority-data": ca}
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "shoot",
            "clusters": [{"name": "shoot", "cluster": cluster_}],
            "contexts": [{"name": "shoot", "context": {"cluster": "shoot", "user": "aggregator"}}],
            "users": [{"name": "aggregator", "user": {"token": token}}],
        }
    )


def populate(seed: Client, targets: int, kubeconfig: str) -> None:
    """``targets`` namespaces (``namespace(i)``), each with its Cluster, the access Secret
    holding ``kubeconfig`` and the dependents at their replicas; the Cluster CRD served."""
    apply(seed, [CLUSTER_CRD])
    wait_for(lambda: _served(seed), 30, "the Cluster CRD")
    data = {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}
    for i in range(targets):
        ns = namespace(i)
        ensure_namespace(seed, ns)
        seed.ensure(f"/api/v1/namespaces/{ns}/secrets", {"metadata": {"name": ACCESS_SECRET}, "data": data})
        for name, replicas in CONTROLLERS.items():
            seed.ensure(DEPLOYMENTS.format(ns=ns), deployment(name, replicas))
        seed.ensure(CLUSTERS_PATH, cluster(ns, machine_types=MACHINE_TYPES))


def _served(seed: Client) -> bool:
    with contextlib.suppress(Exception):
        seed.get(CLUSTERS_PATH)
        return True
    return False


def bench_env(targets: str) -> dict[str, str]:
    """An aggregator's environment at its defaults serving ``targets`` (DWD_TARGETS), but no
    node grace: a benchmark's nodes are minutes old."""
    return {"PATH": "/usr/bin:/bin", "DWD_TARGETS": targets, "DWD_NODE_GRACE": "0s", "DWD_LOG_FORMAT": "json"}


@contextlib.contextmanager
def aggregators(
    kubeconfig: Path, code: Path, tmp: Path, replicas: int = 1, shards: int = 1
) -> Iterator[list[tuple[Process, int]]]:
    """``replicas`` aggregators in gardener mode at their defaults (but no node grace: the
    nodes are minutes old), from the tree ``code``, each with its /metrics port; more than one
    elect on ``shards`` shard Leases in ``garden``."""
    env = bench_env("gardener")
    if replicas > 1:
        env |= {"DWD_LEADER_ELECTION": "true", "DWD_SHARDS": str(shards)}
    procs: list[tuple[Process, int]] = []
    try:
        for i in range(replicas):
            port = free_port()
            proc = start_aggregator(
                env | {"DWD_METRICS_ADDR": f"127.0.0.1:{port}"},
                name=f"aggregator-{i}",
                log_path=tmp / f"aggregator-{i}.log",
                seed_kubeconfig=kubeconfig,
                run=FromSource(source=code),
            )
            procs.append((proc, port))
        yield procs
    finally:
        stop_all(p for p, _ in procs)
