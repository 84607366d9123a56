"""A validating admission webhook whose backend is broken, for our leases in one namespace.

What a cluster-wide webhook that fails does to the agents on a path that works: an HTTPS
server on loopback (kube-apiserver calls it there) with a serving certificate from a CA of
its own, registered by a ValidatingWebhookConfiguration for CREATE and UPDATE of leases in
one namespace only, ``failurePolicy: Fail``. It answers every review with HTTP 500, so
kube-apiserver refuses each write with 500 ("failed calling webhook"); nothing else in the
shoot is touched (the kubelets' ``kube-node-lease`` writes are not sent to it).
"""

from __future__ import annotations

import base64
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from core.lease import LEASE_LABEL
from testenv.base.kapi import Client
from testenv.base.pki import CertificateAuthority

CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.calls += 1
        body = b"webhook backend broken\n"
        self.send_response(500)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per admission review would drown the test's output


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    calls = 0


class FailingWebhook:
    """``open()``, ``register()`` in a shoot, ``unregister()``, ``shutdown()``."""

    def __init__(self, directory: Path, name: str = "dwd-lease-test-failing") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.ca = CertificateAuthority(directory, common_name="failing-webhook-ca")
        serving = self.ca.issue("webhook", "failing-webhook", ip_addresses=["127.0.0.1"], server=True)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(serving.cert), str(serving.key))
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}/validate"

    @property
    def calls(self) -> int:
        """Admission reviews received: zero means kube-apiserver never asked it."""
        return self._server.calls

    def open(self) -> FailingWebhook:
        self._thread.start()
        return self

    def register(self, admin: Client, namespace: str) -> None:
        ca_bundle = base64.b64encode(self.ca.cert_path.read_bytes()).decode()
        admin.create(
            CONFIGURATIONS,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": self.name},
                "webhooks": [
                    {
                        "name": "leases.failing.dwd-lease.test",
                        "clientConfig": {"url": self.url, "caBundle": ca_bundle},
                        "rules": [
                            {
                                "apiGroups": ["coordination.k8s.io"],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE", "UPDATE"],
                                "resources": ["leases"],
                                "scope": "Namespaced",
                            }
                        ],
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                        # Our leases only: kube-system holds leader elections and API server
                        # identities too, which must go on working.
                        "objectSelector": {"matchLabels": {LEASE_LABEL: "true"}},
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 5,
                    }
                ],
            },
        )

    def unregister(self, admin: Client) -> None:
        admin.delete(f"{CONFIGURATIONS}/{self.name}")

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
