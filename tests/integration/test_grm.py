"""The shoot part delivered by the real gardener-resource-manager (testenv/gardener/grm.py), configured as
gardenlet configures a shoot's: its cache of the shoot sees kube-system, kubernetes-dashboard
and kube-node-lease only, its token requestor fills the aggregator's Secret.

One seed, one shoot (accepting the audience ``gardener``, as Gardener's shoots do), one GRM,
shared by the module's cases in order: the ManagedResource applies, what it delivered is all
the aggregator and real agents need, and deleting it takes every object back.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.errors import Forbidden, NotFound, TooManyRequests
from core.lease import lease_path, node_lease_path
from testenv.base.kapi import Client, denial, node_leases
from testenv.base.process import Process, json_log, spawn
from testenv.base.wait import wait_for
from testenv.gardener import grm
from testenv.gardener.apply import RESOURCES, apply, kustomize_build, load_docs, object_path
from testenv.gardener.seed_objects import cluster, module_crds
from testenv.kube.controlplane import ControlPlane, free_port
from testenv.kube.kcm import KcmReplicas
from testenv.worlds import agents as node_agents
from testenv.worlds.shoot_world import Shoot

pytestmark = [pytest.mark.integration, pytest.mark.builds(grm.NAME)]

ROOT = Path(__file__).resolve().parents[2]
NS = "shoot--grm--s"
MR = f"/apis/resources.gardener.cloud/v1alpha1/namespaces/{NS}/managedresources/dwd-lease-shoot"
ACCESS = f"/api/v1/namespaces/{NS}/secrets/shoot-access-dwd-lease-aggregator"
NODES = ("grm-0", "grm-1", "grm-2")
# What gardenlet gives the shoot's GRM as the kubernetes-service-host (api.<internal domain>):
# here a name the node's resolver answers on loopback, where the shoot's KAPI listens.
SERVICE_HOST = "localhost"
AGENT_UID = 65532  # the Gardener overlay's runAsUser


@dataclass
class GrmWorld:
    shoot: Shoot
    grm: grm.ResourceManager
    objects: list[dict[str, Any]]  # what the ManagedResource carries
    tmp: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrmWorld]:
    tmp = tmp_path_factory.mktemp("grm")
    RESOURCES.setdefault("ManagedResource", ("managedresources", True))
    RESOURCES.setdefault("Cluster", ("clusters", False))
    with (
        ControlPlane().running() as seed,
        ControlPlane(extra_apiserver_args=["--api-audiences=kubernetes,gardener"]).running() as shoot_plane,
    ):
        shoot = Shoot(shoot_plane, seed, NS, tmp)
        try:
            shoot.setup(nodes=0)
            with seed.admin_client() as admin:
                apply(admin, module_crds("ManagedResource", "Cluster"))
                wait_for(lambda: _established(admin), 30, "the ManagedResource and Cluster CRDs")
                rendered = kustomize_build(ROOT / "manifests" / "gardener" / "shoot")
                apply(admin, [{**d, "metadata": {**d["metadata"], "namespace": NS}} for d in rendered])
            secret = next(d for d in rendered if d["metadata"]["name"] == "managedresource-dwd-lease-shoot")
            objects = load_docs(base64.b64decode(secret["data"]["objects.yaml"]).decode())
            manager = grm.ResourceManager(
                seed, shoot_plane, NS, workdir=tmp / "grm", kubernetes_service_host=SERVICE_HOST
            )
            with manager.running():
                yield GrmWorld(shoot, manager, objects, tmp)
        finally:
            shoot.close()


def _established(admin: Client) -> bool:
    try:
        admin.get(f"/apis/resources.gardener.cloud/v1alpha1/namespaces/{NS}/managedresources")
        admin.get("/apis/extensions.gardener.cloud/v1alpha1/clusters")
    except (NotFound, TooManyRequests):  # 429: a new CRD's storage is still initialising
        return False
    return True


def conditions(admin: Client) -> dict[str, tuple[str, str]]:
    mr = admin.get(MR)
    return {c["type"]: (c["status"], c.get("reason", "")) for c in mr.get("status", {}).get("conditions", [])}


def present(c: Client, doc: dict[str, Any]) -> bool:
    try:
        c.get(object_path(doc))
    except NotFound:
        return False
    return True


def test_the_managed_resource_applies_into_a_shoot_as_gardenlet_configures_it(world: GrmWorld) -> None:
    admin = world.shoot.seed_admin
    applied = wait_for(
        lambda: conditions(admin).get("ResourcesApplied", ("", ""))[0] == "True" and conditions(admin),
        60,
        f"ResourcesApplied=True (GRM log: {world.grm.proc and world.grm.proc.log_path})",
    )
    print("\nManagedResource dwd-lease-shoot conditions:")
    for kind, (status, reason) in sorted(applied.items()):
        print(f"  {kind}={status} {reason}")
    missing = [object_path(d) for d in world.objects if not present(world.shoot.shoot_admin, d)]
    assert missing == []
    print(f"in the shoot ({len(world.objects)} objects):")
    for d in world.objects:
        print(f"  {d['kind']} {d['metadata'].get('namespace', '-')}/{d['metadata']['name']}")
    recorded = admin.get(MR)["status"]["resources"]
    assert len(recorded) == len(world.objects)


def test_the_token_requestor_secret_and_the_delivered_rbac_are_all_it_takes(world: GrmWorld) -> None:
    """The aggregator in gardener mode with only the Secret GRM filled; real agents with tokens
    bound to their nodes renew under the delivered RBAC and policy, and cannot write a kubelet's
    lease or another node's."""
    w = world.shoot
    data = wait_for(
        lambda: (d := w.seed_admin.get(ACCESS).get("data") or {}).get("token") and d.get("bundle.crt") and d,
        30,
        "the token requestor to fill the aggregator's Secret",
    )
    assert "kubeconfig" not in data  # the server is the aggregator's to know (DWD_SHOOT_SERVER)
    for node in NODES:
        w.shoot_admin.ensure("/api/v1/nodes", {"metadata": {"name": node}})
    apply(w.seed_admin, [cluster(NS)])
    port = free_port()
    aggregator = w.start_aggregator(
        {
            "DWD_TARGETS": "gardener",
            "DWD_SHOOT_KUBECONFIG": "",
            "DWD_NAMESPACE": "",
            "DWD_SHOOT_SERVER": w.shoot.url,
            "DWD_METRICS_ADDR": f"127.0.0.1:{port}",
        }
    )
    agents = [start_agent(world, node) for node in NODES]
    try:
        wait_for(
            lambda: (
                {n for n, lease in node_leases(w.shoot_admin).items() if lease["spec"].get("renewTime")}
                == set(NODES)
            ),
            30,
            f"every agent renewing (aggregator log: {aggregator.log_path})",
        )
        healthy = wait_for(lambda: _judged(port), 30, "the aggregator's verdict on the shoot")
        print(f"\naggregator on {NS}: {healthy}")
        assert healthy["phase"] == "healthy" and healthy["candidates"] == len(NODES)

        token = w.shoot.node_token(NODES[0], namespace="kube-system", service_account="dwd-lease-agent")
        with w.shoot.token_client(token) as agent:
            other = denial(lambda: agent.merge_patch(node_lease_path("kube-system", NODES[1]), {"spec": {}}))
            assert f"may only renew lease dwd-node-lease-{NODES[0]}, not dwd-node-lease-{NODES[1]}" in other
            with pytest.raises(Forbidden):  # a kubelet's lease: no RBAC there at all
                agent.merge_patch(lease_path("kube-node-lease", NODES[0]), {"spec": {}})
    finally:
        for a in agents:
            a.kill()
        aggregator.kill()


def _judged(port: int) -> dict[str, Any] | None:
    try:
        targets = httpx.get(f"http://127.0.0.1:{port}/status", trust_env=False, timeout=5).json()["targets"]
    except (httpx.HTTPError, ValueError):
        return None
    for t in targets:
        if t["name"] == NS and t.get("phase") == "healthy" and t.get("candidates") == len(NODES):
            return {"phase": t["phase"], "candidates": t["candidates"]}
    return None


def start_agent(world: GrmWorld, node: str) -> Process:
    token = world.tmp / f"token-{node}"
    token.write_text(
        world.shoot.shoot.node_token(node, namespace="kube-system", service_account="dwd-lease-agent")
    )
    env = {"PATH": os.environ.get("PATH", ""), "DWD_RENEW_INTERVAL": "500ms", "DWD_LOG_FORMAT": "json"}
    return node_agents.start_agent(
        node,
        token_file=token,
        server=node_agents.ByUrl(world.shoot.shoot.url, world.shoot.shoot.ca_file),
        log_path=world.tmp / f"agent-{node}.log",
        env=env,
    )


def test_the_gardener_agent_runs_non_root_on_the_name_gardener_gives_its_pod(world: GrmWorld) -> None:
    """The delivered DaemonSet's pod as the real KCM's DaemonSet controller makes it, admitted
    through GRM's kubernetes-service-host webhook as gardenlet configures it: non-root, nothing
    of the host mounted, the server the webhook injected. Run as that pod says (as uid 65532
    where the tests run as root, as CI does), the agent renews through that name, verified by
    the CA KCM publishes as kube-root-ca.crt."""
    w, node = world.shoot, NODES[0]
    kcm = KcmReplicas(w.shoot, world.tmp / "kcm-pods")
    kcm.scale(1)
    try:
        pod = wait_for(lambda: _agent_pod(w.shoot_admin, node), 60, "the DaemonSet controller's pod")
        ca = wait_for(
            lambda: _configmap_key(w.shoot_admin, "kube-root-ca.crt", "ca.crt"), 60, "kube-root-ca.crt"
        )
    finally:
        kcm.scale(0)
    spec = pod["spec"]
    injected = [e for e in spec["containers"][0]["env"] if e["name"] == "KUBERNETES_SERVICE_HOST"]
    assert injected == [{"name": "KUBERNETES_SERVICE_HOST", "value": SERVICE_HOST}]
    assert (spec["securityContext"]["runAsNonRoot"], spec["securityContext"]["runAsUser"]) == (
        True,
        AGENT_UID,
    )
    assert [v["name"] for v in spec["volumes"] if "hostPath" in v] == []
    print(f"\npod {pod['metadata']['name']}: securityContext {spec['securityContext']}, volumes "
          f"{[v['name'] for v in spec['volumes']]}, injected {injected[0]}")  # fmt: skip
    # The scheduler's part (no scheduler here): the pod bound to its node, its token bound to it.
    name = pod["metadata"]["name"]
    w.shoot_admin.create(
        f"/api/v1/namespaces/kube-system/pods/{name}/binding",
        {"metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
    )
    token = w.shoot.node_token(node, pod=name)
    try:
        started, running_as = _run_as_the_pod_says(world, spec, node, token, ca)
    finally:
        # Bound to a node without a kubelet, it would wait for one to confirm its end for ever
        # (and with it the DaemonSet's foreground deletion below): ended as a kubelet would.
        w.shoot_admin.request("DELETE", f"/api/v1/namespaces/kube-system/pods/{name}?gracePeriodSeconds=0")
    port = w.shoot.url.rsplit(":", 1)[1]
    assert (started["url"], started["url_from"]) == (
        f"https://{SERVICE_HOST}:{port}",
        "KUBERNETES_SERVICE_HOST",
    )
    print(f"agent renewed {node}'s lease through {started['url']} as uid {running_as}")


def _run_as_the_pod_says(
    world: GrmWorld, spec: dict[str, Any], node: str, token: str, ca: str
) -> tuple[dict[str, Any], int]:
    """The agent started with the pod's environment and files, as uid 65532 where this runs as
    root and an interpreter other users may run is at hand (the venv's may live under a
    home only root can enter: then the system's, with the venv's packages); until it renews."""
    w = world.shoot
    python, uid = sys.executable, None
    system = Path("/usr/bin/python3")
    if os.geteuid() == 0 and system.exists():
        same = subprocess.run(
            [system, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if same.stdout.strip() == str(sys.version_info[:2]):
            python, uid = str(system), AGENT_UID
    before = node_leases(w.shoot_admin)[node]["spec"].get("renewTime")
    with _pod_files(spec, {"token": token, "ca.crt": ca}) as mounts:
        env = _pod_env(spec["containers"][0], node, mounts, port=w.shoot.url.rsplit(":", 1)[1])
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *site.getsitepackages()])
        log = world.tmp / "agent-pod.log"
        agent = spawn("agent-pod", [python, "-m", "agent"], log_path=log, env=env, uid=uid)
        try:
            wait_for(
                lambda: node_leases(w.shoot_admin)[node]["spec"].get("renewTime") != before,
                30,
                f"the agent renewing (log: {agent.log_path})",
            )
            status = Path(f"/proc/{agent.popen.pid}/status").read_text()
        finally:
            agent.kill()
    started = next(e for e in json_log(agent.log_path) if e.get("event") == "agent_started")
    running_as = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))
    assert running_as == (AGENT_UID if uid is not None else os.geteuid())
    return started, running_as


def _agent_pod(admin: Client, node: str) -> dict[str, Any] | None:
    """The agent pod the DaemonSet controller made for ``node`` (it names the node in its
    required node affinity; the scheduler would bind it there)."""
    pods = admin.get(
        "/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io/name%3Ddwd-lease-agent"
    )
    for pod in pods["items"]:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        if [f["values"] for t in terms["nodeSelectorTerms"] for f in t.get("matchFields", [])] == [[node]]:
            return dict(pod)
    return None


def _configmap_key(admin: Client, name: str, key: str) -> str | None:
    try:
        return str(admin.get(f"/api/v1/namespaces/kube-system/configmaps/{name}")["data"][key])
    except NotFound:
        return None


@contextlib.contextmanager
def _pod_files(spec: dict[str, Any], files: dict[str, str]) -> Iterator[dict[str, Path]]:
    """The container's one volume (the projected token and CA) as a directory another user can
    read: each mount path of the container to it, the files the sources name in it."""
    (volume,) = spec["volumes"]
    paths = {s.get("serviceAccountToken", {}).get("path") for s in volume["projected"]["sources"]}
    paths |= {
        i["path"] for s in volume["projected"]["sources"] for i in s.get("configMap", {}).get("items", [])
    }
    assert paths - {None} == set(files), paths
    directory = Path(tempfile.mkdtemp(prefix="dwd-agent-pod-"))
    try:
        directory.chmod(0o755)
        for path, content in files.items():
            (directory / path).write_text(content)
            (directory / path).chmod(0o644)
        yield {m["mountPath"]: directory for m in spec["containers"][0]["volumeMounts"]}
    finally:
        shutil.rmtree(directory)


def _pod_env(container: dict[str, Any], node: str, mounts: dict[str, Path], port: str) -> dict[str, str]:
    """The container's environment as the kubelet makes it: values, the downward API, the
    Service's port (the kubelet adds KUBERNETES_SERVICE_PORT), mount paths mapped to ``mounts``;
    /metrics on a free loopback port (other tests run beside)."""
    fields = {"spec.nodeName": node, "status.hostIP": "127.0.0.1"}
    env = {"PATH": os.environ.get("PATH", ""), "KUBERNETES_SERVICE_PORT": port}
    for e in container["env"]:
        value = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for mount, local in mounts.items():
            value = value.replace(mount, str(local))
        env[e["name"]] = value
    env["DWD_METRICS_ADDR"] = f"127.0.0.1:{free_port()}"
    return env


def test_deleting_the_managed_resource_takes_every_object_back(world: GrmWorld) -> None:
    """Nothing of ours is left in the shoot: the delivered objects, and the leases, which the
    agent's DaemonSet owns. GRM deletes DaemonSets in the foreground: a KCM in the shoot (its
    garbage collector) finishes that."""
    w = world.shoot
    kcm = KcmReplicas(w.shoot, world.tmp / "kcm")
    kcm.scale(1)
    try:
        leases = node_leases(w.shoot_admin)
        assert sorted(leases) == sorted(NODES)
        owners = {r["kind"] for lease in leases.values() for r in lease["metadata"]["ownerReferences"]}
        assert owners == {"DaemonSet"}  # the agent's: they go with it
        w.seed_admin.delete(MR)
        wait_for(
            lambda: not [d for d in world.objects if present(w.shoot_admin, d)] and _gone(w.seed_admin),
            90,
            f"every delivered object gone (GRM log: {world.grm.proc and world.grm.proc.log_path})",
        )
        wait_for(lambda: not node_leases(w.shoot_admin), 30, "the leases gone with the DaemonSet")
    finally:
        kcm.scale(0)


def _gone(admin: Client) -> bool:
    try:
        admin.get(MR)
    except NotFound:
        return True
    return False
