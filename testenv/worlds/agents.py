"""Running real agent processes against the test control plane, as a node's DaemonSet pod would.

``start_agent`` is the one way the harness starts an agent for a node (the tests, the demo, the
benchmarks): the node, its token and how it finds KAPI typed, the rest of its settings
(``DWD_*``) one mapping over them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import NotFound
from core.lease import DEFAULT_LEASE_NAMESPACE, lease_metadata, leases_path, node_lease_path
from testenv.base.kapi import Client
from testenv.base.process import Process, spawn, spawn_python
from testenv.kube.controlplane import ControlPlane
from testenv.kube.kubelet_identity import write_kubeconfig
from testenv.kube.standins import grant_agent_rbac
from testenv.net.netns import NetNs

NS = DEFAULT_LEASE_NAMESPACE


@dataclass(frozen=True)
class ByUrl:
    """KAPI at ``url`` (DWD_APISERVER_URL), its certificate signed by ``ca_file`` (DWD_CA_FILE)."""

    url: str
    ca_file: Path


@dataclass(frozen=True)
class ByKubeconfig:
    """KAPI's server and CA from the node's kubelet kubeconfig (DWD_KUBELET_KUBECONFIG), as the
    DaemonSet configures the agent."""

    path: Path


def agent_env(
    node: str, *, token_file: Path, server: ByUrl | ByKubeconfig, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """An agent's variables on ``node``: its identity and its way to KAPI, then ``env``."""
    reach = (
        {"DWD_APISERVER_URL": server.url, "DWD_CA_FILE": str(server.ca_file)}
        if isinstance(server, ByUrl)
        else {"DWD_KUBELET_KUBECONFIG": str(server.path)}
    )
    return {"NODE_NAME": node, "DWD_TOKEN_FILE": str(token_file), **reach, **(env or {})}


def spawn_agent(
    name: str,
    env: Mapping[str, str],
    *,
    log_path: Path,
    netns: NetNs | None = None,
    source: Path | None = None,
) -> Process:
    """``python -m agent`` with ``env`` (``agent_env``'s), in ``netns`` if given; from
    ``source``, another release's tree (see ``spawn_python``)."""
    if netns is None:
        return spawn_python(name, "agent", log_path=log_path, env=env, source=source)
    assert source is None, "another release's agent runs on the host"
    # Through ``ip netns exec``: not spawn_python, whose argv is the interpreter's own.
    return spawn(name, netns.argv([sys.executable, "-m", "agent"]), log_path=log_path, env=env)


def start_agent(
    node: str,
    *,
    token_file: Path,
    server: ByUrl | ByKubeconfig,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    name: str = "",
    netns: NetNs | None = None,
    source: Path | None = None,
) -> Process:
    """The agent of ``node`` (as process ``name``, ``agent-<node>`` unless given)."""
    full = agent_env(node, token_file=token_file, server=server, env=env)
    return spawn_agent(name or f"agent-{node}", full, log_path=log_path, netns=netns, source=source)


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
        settings = {
            "PATH": os.environ.get("PATH", ""),
            "DWD_RENEW_INTERVAL": "500ms",
            "DWD_LOG_FORMAT": "json",
            "DWD_LOG_LEVEL": "info",
        }
        # A name, not an address: every renewal resolves it first.
        server = ByUrl(f"https://localhost:{port}", self.cp.ca_file)
        return agent_env(node, token_file=self.token_file(node), server=server, env={**settings, **overrides})

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
        proc = spawn_agent(name, env, log_path=self.tmp / f"{name}.log")
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
