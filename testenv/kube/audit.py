"""An API server's audit log of one user's requests: the arguments that start kube-apiserver
with it, a kubeconfig of that user's own, and the requests the log recorded (for the
benchmarks' request counts)."""

from __future__ import annotations

import json
from pathlib import Path

from testenv.kube.controlplane import ControlPlane, kubeconfig_yaml

AGGREGATOR_USER = "dwd-lease-aggregator"
# The API server's counters do not say who sent a request, and another client's count cannot
# be subtracted exactly (requests in flight at either scrape). The audit log can: it records
# the aggregator's user alone, every request once, when it completes.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata", "users": [AGGREGATOR_USER]}, {"level": "None"}],
}


def audit_args(policy: Path, log: Path, user: str = AGGREGATOR_USER) -> list[str]:
    """kube-apiserver's arguments for an audit log of ``user``'s requests at ``log`` (the
    policy written to ``policy``)."""
    policy.write_text(json.dumps(AUDIT_POLICY).replace(AGGREGATOR_USER, user))
    return [f"--audit-policy-file={policy}", f"--audit-log-path={log}"]


def audited_kubeconfig(plane: ControlPlane, path: Path) -> Path:
    """A kubeconfig at ``path`` with a certificate of its own for AGGREGATOR_USER (in
    system:masters), so that the audit policy can single out its requests."""
    assert plane.ca is not None
    cert = plane.ca.issue("aggregator", AGGREGATOR_USER, organizations=["system:masters"])
    user = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
    path.write_text(kubeconfig_yaml(plane.url, plane.ca_file, user))
    return path


def audit_key(line: bytes | str) -> str | None:
    """An audit event's "verb resource" (a nonResourceURL by its path, without the query);
    None for a line that is no JSON (one being written)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    ref = event.get("objectRef") or {}
    return f"{event.get('verb')} {ref.get('resource') or event.get('requestURI', '').split('?')[0]}"


class Audit:
    """The requests in an API server's audit log."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def since(self, mark: int) -> dict[str, int]:
        """Requests since ``mark``, by "verb resource" (nonResourceURLs by path)."""
        counts: dict[str, int] = {}
        with open(self.path, "rb") as f:
            f.seek(mark)
            for line in f:
                key = audit_key(line)
                if key is not None:
                    counts[key] = counts.get(key, 0) + 1
        return counts
