"""Real kube-controller-manager processes against a shoot KAPI, driven by a seed Deployment.

``KcmReplicas`` runs N real KCM processes; ``KcmDeploymentController`` is the seed's deployment
controller stand-in in which the Deployment ``kube-controller-manager`` is backed by those
processes (scale-up starts one, scale-down SIGTERMs one, a dead one is restarted, status counts
the ones whose /healthz answers), while every other Deployment (MCM, CA) keeps the stand-in
behaviour of ``DeploymentController``: status copies spec.

Faithful: the real binary of the pinned release, leader election among its replicas on
``kube-system/kube-controller-manager`` (KCM's own defaults: 15 s lease, 10 s renew deadline),
Gardener's ``--node-monitor-grace-period=40s``, ``--node-monitor-period=5s``, every controller
that can run without a cloud, kubelets or signing keys.

Not faithful: KCM authenticates with the control plane's admin certificate (system:masters)
instead of its own ``system:kube-controller-manager`` identity, and with
``--use-service-account-credentials=false`` all controllers share it, so RBAC never limits KCM
here. No service-account token controller (it needs the signing key), no CSR signing, no
node IPAM, no cloud controllers. The processes run on the test host, not in the seed: scaling
to 0 kills them at once (no pod termination grace, no scheduling delay on scale-up).
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from pathlib import Path

import httpx

from testenv.base import binaries
from testenv.base.kapi import Client
from testenv.base.process import Process, spawn
from testenv.kube.controlplane import ControlPlane, free_port
from testenv.kube.standins import DEPLOYMENTS, DeploymentController

KCM_DEPLOYMENT = "kube-controller-manager"

# Controllers that need what a test shoot lacks; KCM skips most of them by itself with a
# warning, naming them keeps the log honest about what runs.
DISABLED_CONTROLLERS = (
    "service-lb-controller",  # cloud
    "node-route-controller",  # cloud
    "cloud-node-lifecycle-controller",  # cloud
    "node-ipam-controller",  # --allocate-node-cidrs and a cluster CIDR
    "serviceaccount-token-controller",  # the service-account signing key
    "certificatesigningrequest-signing-controller",  # a cluster signing CA
)


# Gardener's grace: a node is Unknown 40 s after its last heartbeat (lease or status), seen by a
# monitor pass every 5 s.
NODE_GRACE_S = 40
NODE_MONITOR_S = 5
# How long a running KCM takes at most, after a node's last heartbeat, to mark it Unknown.
MARKS_WITHIN_S = NODE_GRACE_S + NODE_MONITOR_S


def kcm_argv(binary: Path, kubeconfig: Path, port: int, cert_dir: Path, root_ca: Path) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        # As Gardener starts it: the cluster CA its root-ca-cert-publisher puts into every
        # namespace as kube-root-ca.crt (without it KCM publishes the kubeconfig's CA data,
        # and this kubeconfig names a file).
        f"--root-ca-file={root_ca}",
        "--leader-elect=true",
        "--controllers=*," + ",".join(f"-{c}" for c in DISABLED_CONTROLLERS),
        f"--node-monitor-grace-period={NODE_GRACE_S}s",
        f"--node-monitor-period={NODE_MONITOR_S}s",
        "--use-service-account-credentials=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        # KCM writes a self-signed serving certificate here; /healthz is always allowed.
        f"--cert-dir={cert_dir}",
        "--profiling=false",
    ]


def healthy(port: int) -> bool:
    """Whether the KCM serving on ``port`` answers its /healthz."""
    # KCM's serving certificate is self-signed and throwaway: no verification.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with contextlib.suppress(httpx.HTTPError):
        r = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=ctx, timeout=1.0, trust_env=False)
        return r.status_code == 200
    return False


class KcmReplicas:
    """A set of real KCM processes for one shoot, kept at a wanted count."""

    def __init__(self, shoot: ControlPlane, workdir: Path) -> None:
        self.shoot = shoot
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binary = binaries.find((binaries.KUBE_CONTROLLER_MANAGER,))["kube-controller-manager"]
        self.procs: list[Process] = []
        self._ports: dict[str, int] = {}  # by process name: where its /healthz answers
        self.started = 0  # processes ever started, restarts included
        self._lock = threading.Lock()

    def _start_one(self) -> Process:
        n = self.started
        self.started += 1
        port = free_port()
        certs = self.workdir / f"kcm-{n}-certs"
        argv = kcm_argv(self.binary, self.shoot.kubeconfig, port, certs, self.shoot.ca_file)
        proc = spawn(f"kcm-{n}", argv, log_path=self.workdir / f"kcm-{n}.log", die_with_parent=True)
        self._ports[proc.name] = port
        return proc

    def scale(self, want: int) -> None:
        """Restart the dead, start up to ``want``, SIGTERM the newest beyond it."""
        with self._lock:
            for p in [p for p in self.procs if not p.alive()]:
                p.stop()
                self.procs.remove(p)
            while len(self.procs) < want:
                self.procs.append(self._start_one())
            while len(self.procs) > want:
                self.procs.pop().stop()

    def count(self) -> int:
        with self._lock:
            return len([p for p in self.procs if p.alive()])

    def ready(self) -> int:
        with self._lock:
            procs = list(self.procs)
        return len([p for p in procs if p.alive() and healthy(self._ports[p.name])])

    def logs(self) -> list[Path]:
        return sorted(self.workdir.glob("kcm-*.log"))

    def stop(self) -> None:
        self.scale(0)


class KcmDeploymentController(DeploymentController):
    """The stand-in deployment controller, with ``kube-controller-manager`` run for real."""

    def __init__(self, client: Client, namespace: str, kcm: KcmReplicas) -> None:
        super().__init__(client, namespace)
        self.kcm = kcm

    def step(self) -> None:
        path = DEPLOYMENTS.format(ns=self.namespace)
        for d in self.client.get(path)["items"]:
            if d["metadata"]["name"] != KCM_DEPLOYMENT:
                self.copy_status(d)
                continue
            self.kcm.scale(d["spec"].get("replicas", 1))
            running, ready = self.kcm.count(), self.kcm.ready()
            status = d.get("status") or {}
            if (status.get("replicas"), status.get("readyReplicas")) != (running, ready):
                self.client.merge_patch(
                    f"{path}/{KCM_DEPLOYMENT}/status",
                    {
                        "status": {
                            "observedGeneration": d["metadata"].get("generation", 1),
                            "replicas": running,
                            "readyReplicas": ready,
                            "availableReplicas": ready,
                            "updatedReplicas": running,
                        }
                    },
                )

    def close(self) -> None:
        super().close()
        self.kcm.stop()
