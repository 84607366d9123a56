"""A garden in testenv: Gardener's own API server (gardener-apiserver of the pinned release, built
in GRM's ``go build``: grm.GARDENER_APISERVER) behind a kube-apiserver with the aggregation layer
on, started as Gardener's ``test/envtest`` starts it (``apiserver.go``, ``environment.go``): its
own etcd prefix in the control plane's etcd, authentication and authorization delegated to the
kube-apiserver, an APIService for each group version it serves, reached through an
``ExternalName`` Service. Projects, CloudProfiles, Shoots and the extension's registration are
then created through it, validated by Gardener itself (its admission plugins, the
ValidatingAdmissionPolicies of the kube-apiserver among them).
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from core.errors import KubeError
from testenv.base.kapi import Client
from testenv.base.process import Process, spawn
from testenv.base.wait import wait_for
from testenv.gardener import grm
from testenv.kube.controlplane import ControlPlane, free_port

# gardener-apiserver's group versions (pkg/apiserver/apis.go ``AllGardenerAPIGroupVersions``).
GROUP_VERSIONS = (
    ("core.gardener.cloud", "v1"),
    ("core.gardener.cloud", "v1beta1"),
    ("seedmanagement.gardener.cloud", "v1alpha1"),
    ("operations.gardener.cloud", "v1alpha1"),
    ("security.gardener.cloud", "v1alpha1"),
)
SERVICE = "gardener-apiserver"
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"


@dataclass
class Garden:
    """The garden's kube-apiserver (``cp``, started with ``aggregation``) and gardener-apiserver."""

    cp: ControlPlane
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dwd-garden-")))
    port: int = 0
    proc: Process | None = None

    def start(self, timeout_s: float = 120.0) -> Garden:
        assert self.cp.aggregation and self.cp.ca is not None, "the garden's kube-apiserver needs aggregation"
        binary = grm.find(grm.GARDENER_APISERVER)
        # The aggregation layer verifies the Service's name (envtest's certificate carries it too).
        names = ["localhost", f"{SERVICE}.kube-system.svc"]
        serving = self.cp.ca.issue(SERVICE, SERVICE, dns_names=names, ip_addresses=["127.0.0.1"], server=True)
        kubeconfig = self.workdir / "kubeconfig"
        kubeconfig.write_text(grm.embedded_kubeconfig(self.cp))
        self.port = free_port()
        self.proc = spawn(
            SERVICE,
            [
                str(binary),
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--etcd-servers={self.cp.etcd_url}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                "--cluster-identity=testenv",
                "--authorization-always-allow-paths=/healthz",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--kubeconfig={kubeconfig}",
            ],
            log_path=self.workdir / f"{SERVICE}.log",
            die_with_parent=True,
        )
        try:
            wait_for(self._healthy, timeout_s, f"gardener-apiserver healthy (log: {self.proc.log_path})")
            self._register(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None and self.cp.ca is not None
        if not self.proc.alive():
            raise RuntimeError(f"gardener-apiserver exited (log: {self.proc.log_path})")
        context = ssl.create_default_context(cafile=str(self.cp.ca_file))
        try:
            return (
                httpx.get(f"https://127.0.0.1:{self.port}/healthz", verify=context, timeout=5).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    def _register(self, timeout_s: float) -> None:
        """The ExternalName Service and an APIService per group version, as envtest registers
        them; ready once each is Available and served."""
        with self.cp.admin_client() as admin:
            service = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": SERVICE, "namespace": "kube-system"},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            }
            admin.ensure("/api/v1/namespaces/kube-system/services", service)
            ca = self.cp.ca_file.read_text()
            for group, version in GROUP_VERSIONS:
                admin.ensure(APISERVICES, self._apiservice(group, version, ca))
            log = self.workdir / f"{SERVICE}.log"
            wait_for(
                lambda: self._available(admin), timeout_s, f"Gardener's APIServices available (log: {log})"
            )
            # Available is the APIService's own probe; the proxy to a group comes a moment later.
            served = [f"/apis/{group}/{version}" for group, version in GROUP_VERSIONS]
            wait_for(lambda: all(_lists(admin, p) for p in served), timeout_s, "Gardener's groups served")

    def _apiservice(self, group: str, version: str, ca: str) -> dict[str, Any]:
        return {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{version}.{group}"},
            "spec": {
                "service": {"name": SERVICE, "namespace": "kube-system", "port": self.port},
                "group": group,
                "version": version,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "caBundle": base64.b64encode(ca.encode()).decode(),
            },
        }

    def _available(self, admin: Client) -> bool:
        for group, version in GROUP_VERSIONS:
            conditions = (admin.get(f"{APISERVICES}/{version}.{group}").get("status") or {}).get(
                "conditions"
            ) or []
            if not any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
                return False
        return True

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    @contextlib.contextmanager
    def running(self) -> Iterator[Garden]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


def _lists(admin: Client, path: str) -> bool:
    try:
        admin.get(path)
    except (KubeError, OSError):  # 503 until the aggregation layer reaches it
        return False
    return True


CORE = "/apis/core.gardener.cloud/v1beta1"
PROJECT, PROJECT_NS, CLOUD_PROFILE = "p", "garden-p", "local"
# What Gardener's ExtensionValidator wants registered for a Shoot of provider local with calico.
PROVIDER_KINDS = {
    "provider-local": (("Infrastructure", "local"), ("ControlPlane", "local"), ("Worker", "local")),
    "networking-calico": (("Network", "calico"),),
    "os-local": (("OperatingSystemConfig", "local"),),
}


def _core(kind: str, name: str, spec: dict[str, Any], **meta: str) -> dict[str, Any]:
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": kind,
        "metadata": {"name": name, **meta},
        "spec": spec,
    }


def landscape(admin: Client) -> None:
    """What a Shoot of provider ``local`` needs in the garden, created through gardener-apiserver:
    its Project (and namespace), a CloudProfile, the provider's ControllerRegistrations and a
    CredentialsBinding to a Secret."""
    admin.ensure("/api/v1/namespaces", {"metadata": {"name": PROJECT_NS}})
    admin.ensure(f"{CORE}/projects", _core("Project", PROJECT, {"namespace": PROJECT_NS}))
    profile = {
        "type": "local",
        "kubernetes": {"versions": [{"version": "1.35.4"}]},
        "machineImages": [
            {
                "name": "local",
                "versions": [
                    {"version": "1.0.0", "cri": [{"name": "containerd"}], "architectures": ["amd64"]}
                ],
            }
        ],
        "machineTypes": [{"name": "local", "cpu": "1", "gpu": "0", "memory": "1Gi", "architecture": "amd64"}],
        "regions": [{"name": "local"}],
    }
    admin.ensure(f"{CORE}/cloudprofiles", _core("CloudProfile", CLOUD_PROFILE, profile))
    for name, kinds in PROVIDER_KINDS.items():
        spec = {"resources": [{"kind": kind, "type": type_} for kind, type_ in kinds]}
        admin.ensure(f"{CORE}/controllerregistrations", _core("ControllerRegistration", name, spec))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "local", "namespace": PROJECT_NS}}
    admin.ensure(f"/api/v1/namespaces/{PROJECT_NS}/secrets", secret)
    binding = {
        "apiVersion": "security.gardener.cloud/v1alpha1",
        "kind": "CredentialsBinding",
        "metadata": {"name": "local", "namespace": PROJECT_NS},
        "provider": {"type": "local"},
        "credentialsRef": {"apiVersion": "v1", "kind": "Secret", "name": "local", "namespace": PROJECT_NS},
    }
    admin.ensure(
        f"/apis/security.gardener.cloud/v1alpha1/namespaces/{PROJECT_NS}/credentialsbindings", binding
    )


def shoots_path() -> str:
    return f"{CORE}/namespaces/{PROJECT_NS}/shoots"


def shoot(name: str, extensions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Shoot of provider ``local`` in the project, with ``extensions`` (spec.extensions)."""
    spec: dict[str, Any] = {
        "cloudProfile": {"name": CLOUD_PROFILE},
        "credentialsBindingName": "local",
        "region": "local",
        "networking": {"type": "calico", "nodes": "10.0.0.0/16"},
        "provider": {
            "type": "local",
            "workers": [
                {
                    "name": "local",
                    "machine": {"type": "local"},
                    "cri": {"name": "containerd"},
                    "minimum": 1,
                    "maximum": 2,
                }
            ],
        },
        "kubernetes": {"version": "1.35.4"},
    }
    if extensions is not None:
        spec["extensions"] = extensions
    return _core("Shoot", name, spec, namespace=PROJECT_NS)
