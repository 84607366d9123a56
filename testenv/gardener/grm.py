"""gardener-resource-manager (GRM) of a pinned Gardener release, built from the Go module proxy
and started as gardenlet starts a shoot's: ManagedResources in one control-plane namespace of
the seed, applied into the shoot through a cache of kube-system, kubernetes-dashboard and
kube-node-lease only, the token requestor on, every webhook off.

Built from the module's own tree (``binaries.module_tree``), in the same ``go build`` as our
Gardener types checker (``GARDENER_TYPES``, testenv/gardener/gardener_types.py). Cached like the other
binaries, under the version and the Go toolchain (and the checker's source, for the checker).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from testenv.base import binaries
from testenv.base.process import Process, spawn
from testenv.base.wait import wait_for
from testenv.kube.controlplane import ControlPlane, free_port

VERSION = "v1.149.3"
MODULE = "github.com/gardener/gardener"
NAME = "gardener-resource-manager"
# The seed's CRDs taken from the release's tree (testenv/gardener/seed_objects.py ``module_crds``), by kind:
# the ManagedResource one GRM's source side needs, and those the tests' objects are made of.
SEED_CRDS = {
    "Cluster": "example/seed-crds/10-crd-extensions.gardener.cloud_clusters.yaml",
    "Extension": "example/seed-crds/10-crd-extensions.gardener.cloud_extensions.yaml",
    "ManagedResource": "example/seed-crds/10-crd-resources.gardener.cloud_managedresources.yaml",
    "Machine": "example/seed-crds/10-crd-machine.sapcloud.io_machines.yaml",
    "VerticalPodAutoscaler": "example/seed-crds/10-crd-autoscaling.k8s.io_verticalpodautoscalers.yaml",
    "PrometheusRule": "example/seed-crds/10-crd-monitoring.coreos.com_prometheusrules.yaml",
    "ServiceMonitor": "example/seed-crds/10-crd-monitoring.coreos.com_servicemonitors.yaml",
    # Not a seed's: gardener-operator's, in the garden's runtime cluster, where the second way
    # of installing the extension (manifests/gardener/operator) is applied.
    "OperatorExtension": "example/operator/10-crd-operator.gardener.cloud_extensions.yaml",
}
# gardenlet's target namespaces for a shoot (pkg/gardenlet/operation/botanist/resource_manager.go).
# A pod or namespace with this label set to "disable" is left out by the kubernetes-service-host
# webhook (gardener's resourcesv1alpha1.KubernetesServiceHostInject).
SERVICE_HOST_INJECT = "apiserver-proxy.networking.gardener.cloud/inject"
SHOOT_TARGET_NAMESPACES = ("kube-system", "kubernetes-dashboard", "kube-node-lease")


@dataclass(frozen=True)
class TreeBinary:
    """A main package built from Gardener's module tree: GRM, or a program of ours (``source``,
    copied into the tree as ``package``) that decodes with Gardener's own types."""

    name: str
    package: str
    source: Path | None = None

    def cache_dir(self) -> Path:
        sources = () if self.source is None else (self.source,)
        return binaries.module_cache_dir(self.name, MODULE, VERSION, *sources)

    def binary_path(self) -> Path:
        return self.cache_dir() / self.name


GRM = TreeBinary(NAME, f"./cmd/{NAME}")
# testenv/gardener/gardener_types.py runs it.
GARDENER_TYPES = TreeBinary(
    "dwd-lease-gardener-types",
    "./cmd/dwd-lease-gardener-types",
    binaries.GO_DIR / "gardener-types" / "main.go",
)
# The garden's API server (testenv/gardener/garden.py), where Shoots and the registration are
# validated by Gardener itself.
GARDENER_APISERVER = TreeBinary("gardener-apiserver", "./cmd/gardener-apiserver")
TREE_BINARIES = (GRM, GARDENER_TYPES, GARDENER_APISERVER)


def cache_dir() -> Path:
    return GRM.cache_dir()


def binary_path() -> Path:
    return GRM.binary_path()


def crd_path(kind: str) -> Path:
    return cache_dir() / "crds" / f"{kind}.yaml"


def find_crd(kind: str) -> Path:
    """The CRD of ``kind`` (one of ``SEED_CRDS``) in GRM's release, once any build of GRM under
    way has ended (it is taken from the tree GRM is built from)."""
    find(GRM)
    return crd_path(kind)


def missing(b: TreeBinary) -> bool:
    """Whether ``b`` is not built (GRM: nor the CRDs taken from its tree)."""
    return not b.binary_path().exists() or (b is GRM and not all(crd_path(k).exists() for k in SEED_CRDS))


def build(
    *, force: bool = False, log: TextIO = sys.stderr, only: tuple[TreeBinary, ...] = TREE_BINARIES
) -> dict[str, Path]:
    """Build the missing ones of ``only`` in one ``go build`` of one copy of the tree (the
    checker beside GRM costs seconds, not a second load of its packages); returns the path
    of each."""
    with binaries.building(NAME):
        return _build(force=force, log=log, only=only)


def _build(*, force: bool, log: TextIO, only: tuple[TreeBinary, ...]) -> dict[str, Path]:
    out = {b.name: b.binary_path() for b in only}
    todo = [b for b in only if force or missing(b)]
    if not todo:
        return out
    started = time.monotonic()
    names = ", ".join(b.name for b in todo)
    print(f"testenv: building {names} {VERSION} (cold builds take minutes)", file=log, flush=True)
    with tempfile.TemporaryDirectory(prefix="dwd-grm-build-") as tmp:
        src = binaries.module_tree(MODULE, VERSION, Path(tmp) / "src")
        for b in todo:
            if b.source is not None:
                (src / b.package).mkdir(parents=True)
                shutil.copyfile(b.source, src / b.package / "main.go")
        # A GRM built before a CRD joined SEED_CRDS gets it without a compile.
        compile_ = [b for b in todo if force or not b.binary_path().exists()]
        if compile_:
            _go_build(src, compile_, Path(tmp))
        for b in todo:
            if b is GRM:
                _copy_crds(src)
            if b in compile_:
                binaries.install(Path(tmp) / Path(b.package).name, b.binary_path())
    print(f"testenv: built {names} in {time.monotonic() - started:.0f}s", file=log, flush=True)
    return out


def _go_build(src: Path, todo: list[TreeBinary], out: Path) -> None:
    pkg = "k8s.io/component-base/version"
    ldflags = f"-s -w -X {pkg}.gitVersion={VERSION} -X {pkg}.gitTreeState=clean"
    subprocess.run(
        ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", f"{out}/", *(b.package for b in todo)],
        cwd=src,
        env=binaries.go_build_env(),
        check=True,
    )


def _copy_crds(src: Path) -> None:
    for kind, path in SEED_CRDS.items():
        crd_path(kind).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / path, crd_path(kind))


def find(binary: TreeBinary = GRM) -> Path:
    binaries.wait_for_build(NAME)
    if missing(binary):
        raise FileNotFoundError(
            f"{binary.name} {VERSION} not built in {binary.cache_dir()}: run `make testenv`"
        )
    return binary.binary_path()


def embedded_kubeconfig(cp: ControlPlane) -> str:
    """The control plane's admin kubeconfig with everything embedded: GRM refuses file paths
    (``client certificate files are not supported``)."""

    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "c", "cluster": {"server": cp.url, "certificate-authority-data": data(cp.ca_file)}}
            ],
            "users": [
                {
                    "name": "u",
                    "user": {
                        "client-certificate-data": data(cp.admin.cert),
                        "client-key-data": data(cp.admin.key),
                    },
                }
            ],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        }
    )


@dataclass
class ResourceManager:
    """A shoot's GRM: ManagedResources of ``namespace`` in ``seed``, applied into ``shoot``."""

    seed: ControlPlane
    shoot: ControlPlane
    namespace: str
    # The ManagedResource controller's resync (gardenlet: 1 h; never below 15 s, GRM refuses it).
    sync_period: str = "1h"
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dwd-grm-")))
    proc: Process | None = None
    # gardenlet's kubernetes-service-host webhook: every new pod of the shoot gets this as its
    # KUBERNETES_SERVICE_HOST (gardenlet: api.<internal domain>). Empty: off.
    kubernetes_service_host: str = ""

    def config(self) -> dict[str, Any]:
        ports = {name: free_port() for name in ("webhooks", "health", "metrics")}
        self.health_port, self.webhooks_port = ports["health"], ports["webhooks"]
        return {
            "apiVersion": "resourcemanager.config.gardener.cloud/v1alpha1",
            "kind": "ResourceManagerConfiguration",
            "sourceClientConnection": {
                "kubeconfig": str(self.workdir / "source.kubeconfig"),
                "namespaces": [self.namespace],
                "qps": 100,
                "burst": 130,
            },
            "targetClientConnection": {
                "kubeconfig": str(self.workdir / "target.kubeconfig"),
                "namespaces": list(SHOOT_TARGET_NAMESPACES),
                "qps": 100,
                "burst": 130,
            },
            "leaderElection": {"leaderElect": False},
            "logLevel": "info",
            "logFormat": "json",
            "server": {
                "webhooks": {
                    "bindAddress": "127.0.0.1",
                    "port": ports["webhooks"],
                    "tls": {"serverCertDir": str(self.workdir / "certs")},
                },
                "healthProbes": {"bindAddress": "127.0.0.1", "port": ports["health"]},
                "metrics": {"bindAddress": "127.0.0.1", "port": ports["metrics"]},
            },
            "controllers": {
                "garbageCollector": {"enabled": True, "syncPeriod": "12h"},
                "health": {"concurrentSyncs": 10, "syncPeriod": "1m"},
                "managedResource": {
                    "concurrentSyncs": 20,
                    "syncPeriod": self.sync_period,
                    "alwaysUpdate": True,
                },
                "tokenRequestor": {"enabled": True, "concurrentSyncs": 5},
            },
            "webhooks": (
                {"kubernetesServiceHost": {"enabled": True, "host": self.kubernetes_service_host}}
                if self.kubernetes_service_host
                else {}
            ),
        }

    def start(self, timeout_s: float = 60.0) -> ResourceManager:
        binary = find()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "source.kubeconfig").write_text(embedded_kubeconfig(self.seed))
        (self.workdir / "target.kubeconfig").write_text(embedded_kubeconfig(self.shoot))
        # The webhook server starts even with every webhook off, and wants a certificate.
        certs = self.workdir / "certs"
        certs.mkdir(exist_ok=True)
        assert self.seed.ca is not None, "the seed control plane is not started"
        serving = self.seed.ca.issue("grm-webhook", NAME, dns_names=["localhost"], server=True)
        shutil.copyfile(serving.cert, certs / "tls.crt")
        shutil.copyfile(serving.key, certs / "tls.key")
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump(self.config()))
        # A clean environment: KUBECONFIG and TARGET_KUBECONFIG would win over the file.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir)}
        self.proc = spawn(
            NAME,
            [str(binary), f"--config={config}"],
            log_path=self.workdir / f"{NAME}.log",
            env=env,
            die_with_parent=True,
        )
        wait_for(self._healthy, timeout_s, f"{NAME} healthy (log: {self.proc.log_path})")
        if self.kubernetes_service_host:
            self._register_service_host_webhook()
        return self

    def _register_service_host_webhook(self) -> None:
        """The shoot's KAPI told to call the webhook, as gardenlet has it (its name, rules and
        selectors: pods on create, anywhere but a pod or namespace labelled inject=disable;
        failurePolicy Ignore), at this GRM's webhook server, whose CA is the seed's."""
        assert self.seed.ca is not None
        opt_out = [{"key": SERVICE_HOST_INJECT, "operator": "NotIn", "values": ["disable"]}]
        webhook = {
            "name": "kubernetes-service-host.resources.gardener.cloud",
            "rules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}
            ],
            "namespaceSelector": {"matchExpressions": opt_out},
            "objectSelector": {"matchExpressions": opt_out},
            "clientConfig": {
                "url": f"https://localhost:{self.webhooks_port}/webhooks/kubernetes-service-host",
                "caBundle": base64.b64encode(self.seed.ca.cert_path.read_bytes()).decode(),
            },
            "admissionReviewVersions": ["v1beta1", "v1"],
            "reinvocationPolicy": "Never",
            "failurePolicy": "Ignore",
            "matchPolicy": "Exact",
            "sideEffects": "None",
            "timeoutSeconds": 2,
        }
        with self.shoot.admin_client() as admin:
            admin.ensure(
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                {"metadata": {"name": "gardener-resource-manager-shoot"}, "webhooks": [webhook]},
            )

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.popen.poll() is not None:
            raise RuntimeError(f"{NAME} exited {self.proc.popen.returncode}:\n{self.proc.tail(30)}")
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
        return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    @contextlib.contextmanager
    def running(self) -> Iterator[ResourceManager]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
