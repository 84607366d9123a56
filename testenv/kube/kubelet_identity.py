"""A node's kubelet identity, as the real kubelet (testenv/kube/hollow.py) and the agent find it: its
client certificate from the control plane's CA (CN=system:node:<name>, O=system:nodes, judged by
the Node authorizer and NodeRestriction) and the kubeconfig kubelet has after its TLS bootstrap.

A Python kubelet stand-in lived here until the real kubelet (kubemark's hollow node) took its
place in every test, the demo and the benchmarks that meet a kubelet (docs/harness.md).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from testenv.base.pki import CertificateAuthority, KeyPair

NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40  # kubelet's nodeLeaseDurationSeconds


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
