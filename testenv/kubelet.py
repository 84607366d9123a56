"""A kubelet stand-in: what kube-controller-manager needs to see from a node, and nothing more.

One thread per node; one process may host many (``python -m testenv.kubelet``, e.g. inside a
node's network namespace via ``spawn(..., ns.argv(...))``, reaching KAPI through the URL it is given, such as
the node's DNS name of the load balancer).

Faithful to the real kubelet:
- its identity: a client certificate CN=system:node:<name>, O=system:nodes from the shoot's CA,
  so the Node authorizer and the NodeRestriction admission plugin judge every write;
- it registers its Node, then keeps ``kube-node-lease/<name>`` alive: created with ``renewTime``
  set (KCM ignores renewals of a lease it first saw without one), renewed every 10 s,
  ``leaseDurationSeconds`` 40 (kubelet's defaults);
- it posts NodeStatus with a Ready=True condition and a fresh ``lastHeartbeatTime`` at least
  once a minute (kubelet reports an unchanged status every 5 min; more often is harmless);
- it reports the pods bound to it (``spec.nodeName``) Running and Ready with a pod IP;
- when its path to KAPI is cut its writes just fail and it retries on its clock: no back-off
  tricks, no local state that a real kubelet would not have.

Not faithful: no containers, no probes, no images, no volumes, no capacity worth the name, no
node-status change detection, no watch (it lists its pods each tick), no eviction, no cert
rotation. A pod once reported Ready is re-reported Ready on every tick while the path works,
as a real kubelet whose containers keep passing their readiness probes would.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ipaddress
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from core.errors import Conflict, KubeError, NotFound
from core.lease import format_micro_time
from testenv.client import Client
from testenv.pki import CertificateAuthority, KeyPair
from testenv.poller import Poller

NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40  # kubelet's nodeLeaseDurationSeconds
RENEW_INTERVAL_S = 10.0  # kubelet renews at a quarter of the duration
STATUS_EVERY_S = 60.0  # "at least once a minute"
POD_CIDR = ipaddress.ip_network("10.244.0.0/16")


def node_credentials(ca: CertificateAuthority, node: str) -> KeyPair:
    """A kubelet client certificate for ``node`` from the control plane's CA."""
    return ca.issue(f"kubelet-{node}", f"system:node:{node}", organizations=["system:nodes"])


# Where a kubelet keeps its rotated client certificate and key (one file).
CLIENT_PEM = "/var/lib/kubelet/pki/kubelet-client-current.pem"


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, keys: KeyPair | None = None) -> Path:
    """The kubeconfig a kubelet has after its TLS bootstrap (Gardener's
    ``/var/lib/kubelet/kubeconfig-real``): the CA embedded, the client certificate and key by
    path, and 0600 as kubelet writes it."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "kubelet",
        "clusters": [
            {
                "name": "default-cluster",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "contexts": [{"name": "kubelet", "context": {"cluster": "default-cluster", "user": "default-auth"}}],
        "users": [
            {
                "name": "default-auth",
                "user": {
                    "client-certificate": str(keys.cert) if keys else CLIENT_PEM,
                    "client-key": str(keys.key) if keys else CLIENT_PEM,
                },
            }
        ],
    }
    path.write_text(json.dumps(doc, indent=2))  # JSON is YAML
    path.chmod(0o600)
    return path


def _now() -> str:
    return format_micro_time(datetime.now(UTC))


def _seconds(now: datetime) -> str:
    # metav1.Time: whole seconds, RFC 3339.
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Renewal:
    """The last successful write of each kind (time.time()), for tests to measure against."""

    lease: float = 0.0
    status: float = 0.0
    failures: int = 0


class Kubelet(Poller):
    """Registers ``node``, renews its lease, posts its status and its pods' status."""

    def __init__(
        self,
        url: str,
        ca_file: str,
        cert: KeyPair,
        node: str,
        index: int = 0,
        *,
        renew_interval_s: float = RENEW_INTERVAL_S,
    ) -> None:
        # Shorter only on a test clock whose lease duration is shorter than kubelet's 10 s. At a
        # fixed rate, as kubelet renews; tick() counts its own failures.
        super().__init__(f"kubelet-{node}", renew_interval_s, errors=(), fixed_rate=True)
        self.node = node
        self.index = index  # picks this node's pod IP range
        self.client = Client(url, ca_file, cert=(str(cert.cert), str(cert.key)), timeout_s=5.0)
        # Paused: the kubelet runs but writes nothing, as if its path to KAPI were cut.
        self.paused = threading.Event()
        self.last = Renewal()
        self._lease_created = False
        self._registered = False

    # --- the loop -----------------------------------------------------------------------------

    def step(self) -> None:
        if not self.paused.is_set():
            self.tick()

    def tick(self) -> None:
        """One round; every step is independent, a failure in one must not skip the lease."""
        try:
            if not self._registered:
                self.register()
            if time.time() - self.last.status >= STATUS_EVERY_S:
                self.post_status()
            self.sync_pods()
            self.renew_lease()
        except (KubeError, OSError, httpx.HTTPError):
            self.last.failures += 1

    def close(self) -> None:
        self.client.close()

    # --- the writes ---------------------------------------------------------------------------

    def register(self) -> None:
        with contextlib.suppress(Conflict):
            self.client.create(
                "/api/v1/nodes",
                {
                    "metadata": {
                        "name": self.node,
                        "labels": {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux"},
                    }
                },
            )
        self._registered = True
        self.post_status()

    def post_status(self) -> None:
        now = datetime.now(UTC)
        ts = _seconds(now)
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet stand-in is posting ready status",
            "lastHeartbeatTime": ts,
            "lastTransitionTime": ts,
        }
        # lastTransitionTime should only move on a change; keep the server's when already True.
        with contextlib.suppress(NotFound):
            current = self.client.get(f"/api/v1/nodes/{self.node}")
            for c in (current.get("status") or {}).get("conditions") or []:
                if c.get("type") == "Ready" and c.get("status") == "True":
                    ready["lastTransitionTime"] = c.get("lastTransitionTime", ts)
        self.client.merge_patch(
            f"/api/v1/nodes/{self.node}/status",
            {
                "status": {
                    "conditions": [ready],
                    "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                    "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                    "addresses": [{"type": "Hostname", "address": self.node}],
                    "nodeInfo": {"kubeletVersion": "v1.35.4-standin"},
                }
            },
        )
        self.last.status = now.timestamp()

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases"
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": _now()}
        if not self._lease_created:
            try:
                self.client.create(path, {"metadata": {"name": self.node}, "spec": spec})
            except Conflict:
                self.client.merge_patch(f"{path}/{self.node}", {"spec": spec})
            self._lease_created = True
        else:
            self.client.merge_patch(f"{path}/{self.node}", {"spec": spec})
        self.last.lease = time.time()

    def pod_ip(self, slot: int) -> str:
        return str(POD_CIDR.network_address + 256 * (self.index + 1) + 2 + slot)

    def sync_pods(self) -> None:
        pods = self.client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node}")["items"]
        for slot, pod in enumerate(sorted(pods, key=lambda p: p["metadata"]["name"])):
            if pod["metadata"].get("deletionTimestamp"):
                continue
            self.client.merge_patch(
                f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}/status",
                {"status": self._pod_status(pod, self.pod_ip(slot))},
            )

    def _pod_status(self, pod: dict[str, Any], ip: str) -> dict[str, Any]:
        status = pod.get("status") or {}
        old = {c["type"]: c for c in status.get("conditions") or []}
        ts = _seconds(datetime.now(UTC))

        def cond(kind: str) -> dict[str, Any]:
            was = old.get(kind)
            since = was["lastTransitionTime"] if was and was.get("status") == "True" else ts
            return {"type": kind, "status": "True", "lastTransitionTime": since}

        kinds = ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        started = status.get("startTime") or ts
        return {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": started,
            "conditions": [cond(k) for k in kinds],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started}},
                }
                for c in pod["spec"].get("containers", [])
            ],
        }


def main(argv: list[str] | None = None) -> int:
    """Run kubelet stand-ins for the given nodes until SIGTERM; log renewals to stdout."""
    p = argparse.ArgumentParser(prog="python -m testenv.kubelet")
    p.add_argument("--url", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--cert-dir", required=True, help="holds kubelet-<node>.crt/.key")
    p.add_argument("--node", action="append", required=True)
    p.add_argument("--index", type=int, default=0, help="index of the first node (pod IP ranges)")
    args = p.parse_args(argv)
    cert_dir = Path(args.cert_dir)
    kubelets = [
        Kubelet(
            args.url,
            args.ca,
            KeyPair(cert_dir / f"kubelet-{n}.crt", cert_dir / f"kubelet-{n}.key"),
            n,
            args.index + i,
        )
        for i, n in enumerate(args.node)
    ]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    for k in kubelets:
        k.start()
    # A line per renewal, so the parent reads the last renewal time from the log.
    seen = {k.node: 0.0 for k in kubelets}
    while not done.wait(0.5):
        for k in kubelets:
            if k.last.lease != seen[k.node]:
                seen[k.node] = k.last.lease
                print(f'{{"event": "lease_renewed", "node": "{k.node}", "at": {k.last.lease}}}', flush=True)
    for k in kubelets:
        k.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
