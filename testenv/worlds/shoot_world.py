"""A shoot and its seed for aggregator tests: nodes whose leases a driver renews, controllers a
driver plays the deployment controller for, and the aggregator as its own process."""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.errors import NotFound
from core.lease import DEFAULT_LEASE_NAMESPACE
from testenv.base import containers
from testenv.base.kapi import Client, node_leases
from testenv.base.poller import TRANSIENT, Poller
from testenv.base.process import Process
from testenv.base.wait import wait_for
from testenv.gardener.apply import apply, kustomize_build, load_docs
from testenv.gardener.seed_objects import CLUSTERS_PATH
from testenv.kube.controllers import CONTROLLERS
from testenv.kube.controlplane import ControlPlane, ensure_namespace, ensure_node, kubeconfig_yaml
from testenv.kube.standins import DEPLOYMENTS, DeploymentController, LeaseDriver, deployment
from testenv.net.faultproxy import FaultProxy
from testenv.worlds.aggregators import FromImage, FromSource, start_aggregator

ACCESS_SECRET = "shoot-access-dwd-lease-aggregator"
AGGREGATOR_RBAC = Path(__file__).resolve().parents[2] / "manifests" / "shoot-access" / "rbac.yaml"
SEED_MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "seed"
# What manifests/seed runs, not what it allows: seed_service_account leaves them out.
SEED_WORKLOAD_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}

# Fast but faithful: the same rules as the defaults, on a shorter clock.
FAST_ENV = {
    "DWD_LEASE_DURATION": "2s",
    "DWD_RENEW_INTERVAL": "500ms",
    "DWD_NODE_GRACE": "0s",
    "DWD_CONFIRM_PERIOD": "1s",
    "DWD_RECOVERY_PERIOD": "2s",
    "DWD_LOG_FORMAT": "json",
    "DWD_LOG_LEVEL": "info",
}

FAST_DEPENDENTS = {
    "dependentResourceInfos": [
        {
            "ref": {"kind": "Deployment", "name": "kube-controller-manager", "apiVersion": "apps/v1"},
            "optional": False,
            "scaleUp": {"level": 0, "initialDelay": "0s", "timeout": "10s"},
            "scaleDown": {"level": 1, "initialDelay": "0s", "timeout": "10s"},
        },
        {
            "ref": {"kind": "Deployment", "name": "machine-controller-manager", "apiVersion": "apps/v1"},
            "optional": False,
            "scaleUp": {"level": 1, "initialDelay": "500ms", "timeout": "10s"},
            "scaleDown": {"level": 0, "initialDelay": "0s", "timeout": "10s"},
        },
        {
            "ref": {"kind": "Deployment", "name": "cluster-autoscaler", "apiVersion": "apps/v1"},
            "optional": True,
            "scaleUp": {"level": 2, "initialDelay": "0s", "timeout": "10s"},
            "scaleDown": {"level": 0, "initialDelay": "0s", "timeout": "10s"},
        },
    ]
}


@dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic() when the read began
    replicas: dict[str, int]
    annotations: dict[str, dict[str, str]]
    labels: dict[str, dict[str, str]]


# The longest a Sampler may go without a sample inside a window a test checks (it samples
# every 0.1 s: a gap this long is a failing or starved sampler, not a slow one).
MAX_GAP_S = 2.0


class Sampler(Poller):
    """The controllers' spec.replicas, annotations and labels every ``every_s``, from a thread:
    a scale that came and went between two checks of a test is still in the record."""

    def __init__(self, client: Client, namespace: str, every_s: float = 0.1) -> None:
        # At a fixed rate: the record is read as a time series.
        super().__init__("sampler", every_s, fixed_rate=True)
        self.client = client
        self.namespace = namespace
        self.samples: list[Sample] = []
        # When a sample could not be taken, and why: a check over a window with one fails.
        self.failures: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def step(self) -> None:
        started = time.monotonic()
        try:
            items = self.client.get(DEPLOYMENTS.format(ns=self.namespace))["items"]
        except TRANSIENT as e:
            with self._lock:
                self.failures.append((started, f"{type(e).__name__}: {e}"))
            raise  # counted by the poller, which samples on
        sample = Sample(
            started,
            {d["metadata"]["name"]: d["spec"].get("replicas", 1) for d in items},
            {d["metadata"]["name"]: dict(d["metadata"].get("annotations") or {}) for d in items},
            {d["metadata"]["name"]: dict(d["metadata"].get("labels") or {}) for d in items},
        )
        with self._lock:
            self.samples.append(sample)

    def close(self) -> None:
        self.client.close()

    def between(self, t0: float, t1: float = float("inf")) -> list[Sample]:
        """The samples of [t0, t1] (t1 at most now), which must cover it: "nothing bad was
        seen" is never said of a window nobody looked at. A window without a sample, with a
        sample that failed, or with a gap over MAX_GAP_S at its start, between two samples or
        at its end (the sampler starved), fails the test."""
        with self._lock:
            started = self.samples[0].t if self.samples else None
            samples = [s for s in self.samples if t0 <= s.t <= t1]
            failed = [(t, why) for t, why in self.failures if t0 <= t <= t1]
        end = min(t1, time.monotonic())
        if started is None or not samples:
            raise AssertionError(f"the sampler took no sample in the window ({self.errors} failed)")
        if failed:
            raise AssertionError(
                f"the sampler failed {len(failed)} times in the window, first: {failed[0][1]}"
            )
        times = [max(t0, started), *(s.t for s in samples), end]
        gap = max(b - a for a, b in itertools.pairwise(times))
        if gap > MAX_GAP_S:
            raise AssertionError(
                f"the sampler saw nothing for {gap:.1f}s of the window ({self.errors} samples failed)"
            )
        return samples

    def latest(self) -> Sample | None:
        with self._lock:
            return self.samples[-1] if self.samples else None

    def first(self, bad: Callable[[Sample], bool], after: float = float("-inf")) -> Sample | None:
        """The first sample taken after ``after`` for which ``bad`` holds; None when there is
        none in a window the samples cover (``between``)."""
        return next((s for s in self.between(after) if bad(s)), None)


@dataclass
class Shoot:
    """A fresh shoot control plane, a namespace in the shared seed, drivers and aggregators."""

    shoot: ControlPlane
    seed: ControlPlane
    namespace: str
    tmp: Path
    shoot_admin: Client = field(init=False)
    seed_admin: Client = field(init=False)
    driver: LeaseDriver = field(init=False)
    controller: DeploymentController = field(init=False)
    aggregators: list[Process] = field(default_factory=list)
    proxies: list[FaultProxy] = field(default_factory=list)
    samplers: list[Sampler] = field(default_factory=list)
    # Aggregators run from the image: killing ``podman run`` leaves the container running.
    containers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shoot_admin = self.shoot.admin_client()
        self.seed_admin = self.seed.admin_client()

    def setup(self, nodes: int = 10, controllers: dict[str, int] | None = None) -> Shoot:
        ensure_namespace(self.shoot_admin, DEFAULT_LEASE_NAMESPACE)
        names = [f"node-{i}" for i in range(nodes)]
        for n in names:
            ensure_node(self.shoot_admin, n)
        ensure_namespace(self.seed_admin, self.namespace)
        for name, replicas in (controllers or CONTROLLERS).items():
            self.seed_admin.create(DEPLOYMENTS.format(ns=self.namespace), deployment(name, replicas))
        self.driver = LeaseDriver(self.shoot.admin_client(), names)
        self.controller = DeploymentController(self.seed.admin_client(), self.namespace)
        self.driver.start()
        self.controller.start()
        wait_for(lambda: self.ready_replicas() == (controllers or CONTROLLERS), 10, "deployments ready")
        return self

    def election_env(self) -> dict[str, str]:
        """Leader election on a Lease in this shoot's namespace, with short timings in client-go's
        order (a leader stops writing 3 s after its last renewal; a standby waits 4 s)."""
        return {
            "DWD_LEADER_ELECTION": "true",
            "DWD_LEADER_ELECTION_NAMESPACE": self.namespace,
            "DWD_LEADER_LEASE_DURATION": "4s",
            "DWD_LEADER_RENEW_DEADLINE": "3s",
            "DWD_LEADER_RETRY_PERIOD": "500ms",
        }

    def election_holder(self) -> str:
        """Who holds the aggregators' election Lease in this shoot's namespace ("" when nobody)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        holders = [
            str((i.get("spec") or {}).get("holderIdentity") or "") for i in self.seed_admin.get(path)["items"]
        ]
        return next((h for h in holders if h), "")

    def env(self, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
        """The aggregator's settings here (FAST_ENV, the tests' dependents), then ``overrides``;
        what it serves is ``start_aggregator``'s (aggregators.aggregator_env)."""
        dependents = self.tmp / "dependents.yaml"
        dependents.write_text(yaml.safe_dump(FAST_DEPENDENTS))
        return {
            "PATH": os.environ.get("PATH", ""),
            "DWD_DEPENDENTS_FILE": str(dependents),
            **FAST_ENV,
            **(overrides or {}),
        }

    def seed_proxy(self) -> FaultProxy:
        """A FaultProxy in front of the seed, for ``start_aggregator(seed=proxy)``."""
        proxy = FaultProxy(self.seed).open()
        self.proxies.append(proxy)
        return proxy

    def shoot_proxy(self) -> FaultProxy:
        """A FaultProxy in front of the shoot's API server, for the aggregator's own requests
        (``start_aggregator({"DWD_SHOOT_KUBECONFIG": ...})``): the agents keep the direct path."""
        proxy = FaultProxy(self.shoot).open()
        self.proxies.append(proxy)
        return proxy

    def sampler(self, every_s: float = 0.1) -> Sampler:
        sampler = Sampler(self.seed.admin_client(), self.namespace, every_s)
        self.samplers.append(sampler)
        sampler.start()
        return sampler

    def start_aggregator(
        self,
        env: Mapping[str, str] | None = None,
        *,
        seed: FaultProxy | None = None,
        image: str | None = None,
        module: str = "aggregator",
        source: Path | None = None,
    ) -> Process:
        """An aggregator serving this shoot (through ``seed``, a proxy in front of the seed), with
        ``env`` over ``self.env()``: a process (``python -m module``; from ``source``, another
        release's tree), or from its ``image``."""
        n = len(self.aggregators)
        seed_kubeconfig = (
            self.seed.kubeconfig
            if seed is None
            else seed.kubeconfig(self.tmp / f"seed-proxy-{seed.port}.kubeconfig")
        )
        run: FromSource | FromImage = FromSource(module, source)
        if image is not None:
            run = FromImage(image, f"dwd-aggregator-{self.namespace}-{n}", self.tmp / f"aggregator-{n}-files")
            self.containers.append(run.container)
        agg = start_aggregator(
            self.env(env),
            name=f"aggregator-{n}",
            log_path=self.tmp / f"aggregator-{n}.log",
            shoot_kubeconfig=self.shoot.kubeconfig,
            seed_kubeconfig=seed_kubeconfig,
            namespace=self.namespace,
            run=run,
        )
        self.aggregators.append(agg)
        return agg

    def leases(self) -> dict[str, dict[str, Any]]:
        return node_leases(self.shoot_admin)

    def wait_leases_renewed(self, timeout_s: float = 60) -> None:
        # The aggregator creates the leases: its process start is what a loaded CI machine slows
        # (20 s ran out when a suite's first tests started four worlds at once).
        wait_for(
            lambda: (
                len([x for x in self.leases().values() if x["spec"].get("renewTime")])
                >= len(self.driver.alive)
            ),
            timeout_s,
            "every lease created and renewed",
            every_s=0.2,
        )

    def deployments(self) -> dict[str, dict[str, Any]]:
        items = self.seed_admin.get(DEPLOYMENTS.format(ns=self.namespace))["items"]
        return {d["metadata"]["name"]: d for d in items}

    def replicas(self) -> dict[str, int]:
        return {n: d["spec"].get("replicas", 1) for n, d in self.deployments().items()}

    def ready_replicas(self) -> dict[str, int]:
        return {n: (d.get("status") or {}).get("readyReplicas", 0) for n, d in self.deployments().items()}

    def annotation(self, name: str, key: str) -> str | None:
        value = (self.deployments()[name]["metadata"].get("annotations") or {}).get(key)
        return None if value is None else str(value)

    def aggregator_access(self, bound_to: str) -> dict[str, Any]:
        """A token kubeconfig for the aggregator's service account, bound to Secret ``bound_to``
        in the shoot: deleting that Secret revokes the token."""
        apply(self.shoot_admin, load_docs(AGGREGATOR_RBAC.read_text()))
        secret = self.shoot_admin.ensure(
            "/api/v1/namespaces/kube-system/secrets", {"metadata": {"name": bound_to}}
        )
        token = self.shoot_admin.create(
            "/api/v1/namespaces/kube-system/serviceaccounts/dwd-lease-aggregator/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "name": bound_to,
                        "uid": secret["metadata"]["uid"],
                    },
                },
            },
        )["status"]["token"]
        ca = base64.b64encode(self.shoot.ca_file.read_bytes()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "shoot",
            "clusters": [
                {"name": "shoot", "cluster": {"server": self.shoot.url, "certificate-authority-data": ca}}
            ],
            "contexts": [{"name": "shoot", "context": {"cluster": "shoot", "user": "aggregator"}}],
            "users": [{"name": "aggregator", "user": {"token": token}}],
        }

    def seed_service_account(self) -> Path:
        """A kubeconfig of the seed aggregator's own ServiceAccount (garden/dwd-lease-aggregator)
        under the shipped RBAC and admission policy (manifests/seed), applied to the seed: the
        identity a seed runs the aggregator with, whose every write the policy judges."""
        docs = [d for d in kustomize_build(SEED_MANIFESTS) if d["kind"] not in SEED_WORKLOAD_KINDS]
        ensure_namespace(self.seed_admin, "garden")
        apply(self.seed_admin, docs)
        token = self.seed_admin.create(
            "/api/v1/namespaces/garden/serviceaccounts/dwd-lease-aggregator/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
        path = self.tmp / "seed-service-account.kubeconfig"
        path.write_text(kubeconfig_yaml(self.seed.url, self.seed.ca_file, {"token": token}))
        return path

    def store_access(self, kubeconfig: dict[str, Any] | str, name: str = ACCESS_SECRET) -> None:
        """The kubeconfig secret in the shoot's control-plane namespace of the seed."""
        text = kubeconfig if isinstance(kubeconfig, str) else yaml.safe_dump(kubeconfig)
        apply(
            self.seed_admin,
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name, "namespace": self.namespace},
                    "data": {"kubeconfig": base64.b64encode(text.encode()).decode()},
                }
            ],
        )

    def events(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.seed_admin.get(f"/api/v1/namespaces/{self.namespace}/events")[
            "items"
        ]
        return items

    def close(self) -> None:
        for a in self.aggregators:
            a.kill()
        for name in self.containers:
            containers.remove(name)
        for sampler in self.samplers:
            sampler.stop()
        for proxy in self.proxies:
            proxy.shutdown()
        self.driver.stop()
        self.controller.stop()
        # The seed outlives the shoot: a Cluster left in it would be served by the next test's
        # aggregator that discovers Gardener's Clusters.
        with contextlib.suppress(NotFound):
            self.seed_admin.delete(f"{CLUSTERS_PATH}/{self.namespace}")
        self.shoot_admin.close()
        self.seed_admin.close()


@contextlib.contextmanager
def shoot_for(
    seed: ControlPlane, namespace: str, tmp: Path, extra_sans: tuple[str, ...] = ()
) -> Iterator[Shoot]:
    with ControlPlane(extra_sans=extra_sans).running() as shoot_plane:
        s = Shoot(shoot_plane, seed, namespace, tmp)
        try:
            yield s
        finally:
            s.close()
