"""Running real agent processes against the test control plane, as a node's DaemonSet pod would."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import NotFound
from core.lease import DEFAULT_LEASE_NAMESPACE, lease_metadata, leases_path, node_lease_path
from testenv.base.kapi import Client
from testenv.base.process import Process, spawn_python
from testenv.kube.controlplane import ControlPlane
from testenv.kube.kubelet_identity import write_kubeconfig
from testenv.kube.standins import grant_agent_rbac

NS = DEFAULT_LEASE_NAMESPACE


@dataclass
class Agents:
    """Sets up a node's identity (token bound to a Pod on it) and starts agents for it."""

    cp: ControlPlane
    tmp: Path
    admin: Client
    procs: list[Process] = field(default_factory=list)

    def token_file(self, node: str, pod: str = "") -> Path:
        path = self.tmp / f"{node}.token"
        tmp = path.with_suffix(".new")
        tmp.write_text(self.cp.node_token(node, pod=pod))
        tmp.replace(path)  # atomic, like kubelet's projected volume
        return path

    def env(self, node: str, **overrides: str) -> dict[str, str]:
        port = self.cp.url.rsplit(":", 1)[1]
        base = {
            "PATH": os.environ.get("PATH", ""),
            # A name, not an address: every renewal resolves it first.
            "DWD_APISERVER_URL": f"https://localhost:{port}",
            "NODE_NAME": node,
            "DWD_TOKEN_FILE": str(self.token_file(node)),
            "DWD_CA_FILE": str(self.cp.ca_file),
            "DWD_RENEW_INTERVAL": "500ms",
            "DWD_LOG_FORMAT": "json",
            "DWD_LOG_LEVEL": "info",
        }
        return {**base, **overrides}

    def kubelet_env(self, node: str, **overrides: str) -> dict[str, str]:
        """``env`` as the DaemonSet configures an agent: the server and the CA from a kubelet
        kubeconfig (written beside the token), not DWD_APISERVER_URL and DWD_CA_FILE."""
        env = self.env(node, **overrides)
        path = write_kubeconfig(
            self.tmp / f"kubeconfig-{node}",
            env.pop("DWD_APISERVER_URL"),
            Path(env.pop("DWD_CA_FILE")).read_bytes(),
        )
        return {**env, "DWD_KUBELET_KUBECONFIG": str(path)}

    def start(self, env: dict[str, str]) -> Process:
        name = f"agent-{env['NODE_NAME']}-{len(self.procs)}"
        proc = spawn_python(name, "agent", log_path=self.tmp / f"{name}.log", env=env)
        self.procs.append(proc)
        return proc

    def create_lease(self, node: str, **annotations: str) -> dict[str, Any]:
        return self.admin.create(
            leases_path(NS), {"metadata": {**lease_metadata(node), "annotations": annotations}, "spec": {}}
        )

    def lease(self, node: str) -> dict[str, Any] | None:
        try:
            return self.admin.get(node_lease_path(NS, node))
        except NotFound:
            return None

    def renew_times(self, node: str, duration_s: float) -> list[tuple[float, str]]:
        """(local arrival time, renewTime) of each renewal seen during ``duration_s``, by polling."""
        seen: list[tuple[float, str]] = []
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            lease = self.lease(node)
            renew = (lease or {}).get("spec", {}).get("renewTime")
            if renew and (not seen or seen[-1][1] != renew):
                seen.append((time.monotonic(), renew))
            time.sleep(0.02)
        return seen

    def close(self) -> None:
        for p in self.procs:
            p.kill()


@contextlib.contextmanager
def agents_for(cp: ControlPlane, tmp: Path) -> Iterator[Agents]:
    with cp.admin_client() as admin:
        grant_agent_rbac(admin)
        agents = Agents(cp, tmp, admin)
        try:
            yield agents
        finally:
            agents.close()


def pod_env(
    container: dict[str, Any], *, node: str = "", host_ip: str = "", namespace: str = ""
) -> dict[str, str]:
    """A container's env as kubelet gives it on ``node`` in ``namespace``: the downward API's
    node name, host IP and namespace filled in (those given), ``$(VAR)`` references to the
    variables before it expanded."""
    given = {"spec.nodeName": node, "status.hostIP": host_ip, "metadata.namespace": namespace}
    fields = {path: value for path, value in given.items() if value}
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "valueFrom" in var:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, f"{var['name']}: the downward API's {path} is not played here"
            env[var["name"]] = fields[path]
            continue
        value = str(var.get("value", ""))
        for name, known in env.items():
            value = value.replace(f"$({name})", known)
        env[var["name"]] = value
    return env
