"""The demo scenario, also used by the detection benchmark.

Two real API servers (shoot and seed), ten nodes each with a real agent
process and a kubelet stand-in that reach the shoot's KAPI through a TCP load
balancer under an external name, a pod on each node behind a Service, the
controllers in the seed, and the aggregator with its defaults. The seed's
kube-controller-manager Deployment runs real KCM processes against the shoot
(its node lifecycle controller marks a node Unknown 40 s after its kubelet
goes quiet); machine-controller-manager and cluster-autoscaler are Deployment
objects only. The load balancer is cut: every renewal fails, KAPI itself stays
healthy, the aggregator scales the controllers down before KCM's grace period
ends, and the cut is held past it: no node goes Unknown, no endpoint is taken
away. The load balancer comes back: the controllers come back, each with its
old replicas, and KCM finds every node Ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from aggregator.records import MELTDOWN, RECORD, REPLICAS
from core.lease import DEFAULT_LEASE_NAMESPACE, leases_path, parse_micro_time
from testenv import workload
from testenv.controlplane import ControlPlane, ensure_namespace
from testenv.kcm import KcmDeploymentController, KcmReplicas
from testenv.kubelet import Kubelet, node_credentials, write_kubeconfig
from testenv.standins import CONTROLLERS, DEPLOYMENTS, deployment, grant_agent_rbac, json_log
from testenv.tcpproxy import TcpProxy

# KCM's node-monitor grace period as Gardener sets it, and how long the demo holds the cut
# beyond the moment KCM would have acted.
GRACE_S = 40
HOLD_PAST_GRACE_S = 10

NAMESPACE = "shoot--demo--local"
SHOWN_EVENTS = {
    "target_observing",
    "target_phase",
    "scale_down_blocked",
    "resource_scaled_down",
    "resource_scaled_up",
    "target_scale_down",
    "target_scale_up",
}


@dataclass
class Timeline:
    start: float = field(default_factory=time.monotonic)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, what: str) -> float:
        self.marks.setdefault(what, time.monotonic())
        return self.marks[what]

    def since(self, a: str, b: str) -> float:
        return self.marks[b] - self.marks[a]


class Show:
    """Prints what happens, as it happens."""

    def __init__(self, out: TextIO | None, timeline: Timeline) -> None:
        self.out = out
        self.timeline = timeline

    def __call__(self, text: str) -> None:
        if self.out is not None:
            print(f"[{time.monotonic() - self.timeline.start:6.1f}s] {text}", file=self.out, flush=True)


def lease_ages(admin: Any) -> list[float]:
    now = datetime.now(UTC)
    ages = []
    for lease in admin.get(leases_path(DEFAULT_LEASE_NAMESPACE))["items"]:
        renew = lease["spec"].get("renewTime")
        ages.append((now - parse_micro_time(renew)).total_seconds() if renew else float("inf"))
    return ages


class LogTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_events(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        events = []
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events


@contextlib.contextmanager
def world(nodes: int, tmp: Path, show: Show) -> Iterator[dict[str, Any]]:
    show("starting the shoot's kube-apiserver + etcd and the seed's (real binaries, loopback only)")
    with ControlPlane().running() as shoot, ControlPlane().running() as seed:
        assert shoot.ca is not None
        host_port = shoot.url.rsplit(":", 1)[1]
        lb = TcpProxy(upstream=("127.0.0.1", int(host_port))).open()
        shoot_admin, seed_admin = shoot.admin_client(), seed.admin_client()
        kcm = KcmReplicas(shoot, tmp / "kcm")
        controller = KcmDeploymentController(seed.admin_client(), NAMESPACE, kcm)
        procs: list[subprocess.Popen[bytes]] = []
        names = [f"node-{i}" for i in range(nodes)]
        # The kubelets go through the load balancer too: the cut silences them as it does the agents.
        kubelets = [
            Kubelet(f"https://localhost:{lb.port}", str(shoot.ca_file), node_credentials(shoot.ca, n), n, i)
            for i, n in enumerate(names)
        ]
        try:
            grant_agent_rbac(shoot_admin)
            ensure_namespace(seed_admin, NAMESPACE)
            for name, replicas in CONTROLLERS.items():
                seed_admin.ensure(DEPLOYMENTS.format(ns=NAMESPACE), deployment(name, replicas))
            controller.start()
            for k in kubelets:
                k.start()
            workload.deploy(shoot_admin, names)
            show(
                f"{nodes} nodes (kubelet stand-ins), a pod on each behind a Service; controllers in the "
                f"seed: {CONTROLLERS}, the kube-controller-manager replicas real KCM processes"
            )
            yield {
                "shoot": shoot,
                "seed": seed,
                "lb": lb,
                "kcm": kcm,
                "names": names,
                "procs": procs,
                "shoot_admin": shoot_admin,
                "seed_admin": seed_admin,
            }
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
                if p.poll() is None:
                    p.kill()
            for k in kubelets:
                k.stop()
            controller.stop()
            lb.shutdown()
            shoot_admin.close()
            seed_admin.close()


def start_agents(w: dict[str, Any], tmp: Path, env_base: dict[str, str]) -> None:
    shoot: ControlPlane = w["shoot"]
    for node in w["names"]:
        token = tmp / f"{node}.token"
        token.write_text(shoot.node_token(node))
        # The node's kubelet kubeconfig, naming the load balancer the kubelet stand-ins use:
        # the agent takes its server and CA from there, as on a Gardener node.
        kubeconfig = write_kubeconfig(
            tmp / f"kubeconfig-{node}", f"https://localhost:{w['lb'].port}", shoot.ca_file.read_bytes()
        )
        env = {
            **env_base,
            "DWD_KUBELET_KUBECONFIG": str(kubeconfig),
            "NODE_NAME": node,
            "DWD_TOKEN_FILE": str(token),
            "DWD_LOG_FORMAT": "json",
        }
        with open(tmp / f"agent-{node}.log", "wb") as log:
            w["procs"].append(
                subprocess.Popen([sys.executable, "-m", "agent"], env=env, stdout=log, stderr=log)
            )


def start_aggregator(
    w: dict[str, Any], tmp: Path, env_base: dict[str, str], overrides: dict[str, str]
) -> Path:
    log_path = tmp / "aggregator.log"
    env = {
        **env_base,
        "DWD_SHOOT_KUBECONFIG": str(w["shoot"].kubeconfig),
        "DWD_SEED_KUBECONFIG": str(w["seed"].kubeconfig),
        "DWD_NAMESPACE": NAMESPACE,
        "DWD_LOG_FORMAT": "json",
        **overrides,
    }
    with open(log_path, "wb") as log:
        w["procs"].append(
            subprocess.Popen([sys.executable, "-m", "aggregator"], env=env, stdout=log, stderr=log)
        )
    return log_path


def wait(pred: Callable[[], bool], timeout_s: float, what: str, tick: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: {what} did not happen within {timeout_s:.0f}s")
        tick()
        time.sleep(0.25)


def hold(seconds: float, tick: Callable[[], None]) -> None:
    """Wait, but keep showing what happens meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tick()
        time.sleep(0.25)


def run(
    out: TextIO | None = sys.stdout, nodes: int = 10, overrides: dict[str, str] | None = None
) -> dict[str, float]:
    """Runs the whole scenario; returns the measured times in seconds."""
    overrides = {"DWD_NODE_GRACE": "0s", **(overrides or {})}
    tl = Timeline()
    show = Show(out, tl)
    env_base = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with tempfile.TemporaryDirectory(prefix="dwd-demo-") as tmp_s, world(nodes, Path(tmp_s), show) as w:
        tmp = Path(tmp_s)
        start_agents(w, tmp, env_base)
        log_path = start_aggregator(w, tmp, env_base, overrides)
        show(f"started {nodes} agents (through the load balancer) and the aggregator with {overrides}")
        tail = LogTail(log_path)
        seed_admin = w["seed_admin"]
        last_status = [""]

        def replicas() -> dict[str, int]:
            items = seed_admin.get(DEPLOYMENTS.format(ns=NAMESPACE))["items"]
            return {d["metadata"]["name"]: d["spec"].get("replicas", 1) for d in items}

        def tick() -> None:
            for e in tail.new_events():
                if e.get("event") in SHOWN_EVENTS:
                    detail = {
                        k: v for k, v in e.items() if k not in ("event", "timestamp", "level", "target")
                    }
                    show(f"aggregator: {e['event']} {detail}")
            ages = lease_ages(w["shoot_admin"])
            fresh = sum(1 for a in ages if a < 4)
            r = replicas()
            o = workload.observe(w["shoot_admin"])
            ready = sum(1 for v in o.nodes.values() if v == "True")
            status = (
                f"leases renewed in the last 4s: {fresh}/{len(ages)}   "
                f"KCM {r.get('kube-controller-manager')} ({w['kcm'].count()} running)  "
                f"MCM {r.get('machine-controller-manager')}  CA {r.get('cluster-autoscaler')}   "
                f"nodes Ready {ready}/{len(o.nodes)}, Unknown {len(o.unknown())}   "
                f"ready endpoints {o.ready_endpoints}/{nodes}"
            )
            outcome["unknown"] = max(outcome["unknown"], len(o.unknown()))
            outcome["min_endpoints"] = min(outcome["min_endpoints"], o.ready_endpoints)
            if status != last_status[0]:
                show(status)
                last_status[0] = status

        outcome = {"unknown": 0, "min_endpoints": nodes}

        def healthy() -> bool:
            o = workload.observe(w["shoot_admin"])
            renewing = len([a for a in lease_ages(w["shoot_admin"]) if a < 4]) == nodes
            ready = list(o.nodes.values()) == ["True"] * nodes
            return renewing and ready and o.ready_endpoints == nodes and w["kcm"].ready() >= 1

        wait(healthy, 90, "first renewals, every node Ready, every endpoint ready, KCM running", tick)
        show("every node renews its lease through the load balancer")
        wait(
            lambda: any(e.get("phase") == "healthy" for e in json_log(log_path)),
            60,
            "a healthy verdict",
            tick,
        )
        hold(2, tick)

        show(">>> cutting the load balancer: nodes cannot reach KAPI; KAPI itself is fine")
        w["lb"].close()
        tl.mark("cut")
        outcome.update(unknown=0, min_endpoints=nodes)  # what happens from the cut on
        down = dict.fromkeys(CONTROLLERS, 0)
        wait(lambda: replicas().get("machine-controller-manager") == 0, 120, "MCM scaled down", tick)
        tl.mark("mcm_down")
        mcm_down_wall = datetime.now(UTC)
        wait(lambda: replicas() == down, 60, "every controller scaled down", tick)
        tl.mark("all_down")
        all_down_wall = datetime.now(UTC)
        last_renewal = max(
            parse_micro_time(lease["spec"]["renewTime"])
            for lease in w["shoot_admin"].get(leases_path(DEFAULT_LEASE_NAMESPACE))["items"]
        )
        show(
            f"protected: MCM down {tl.since('cut', 'mcm_down'):.1f}s and KCM down "
            f"{tl.since('cut', 'all_down'):.1f}s after the cut (KCM's node grace period is 40-50s)"
        )
        wait(lambda: w["kcm"].count() == 0, 30, "no KCM process left", tick)
        tl.mark("kcm_stopped")
        held = GRACE_S + HOLD_PAST_GRACE_S - tl.since("cut", "kcm_stopped")
        show(f">>> holding the cut {held:.0f}s more: past KCM's {GRACE_S}s grace, no KCM is there to act")
        hold(held, tick)

        show(">>> the load balancer is back")
        w["lb"].open()
        tl.mark("heal")
        wait(lambda: replicas() == CONTROLLERS, 180, "every controller back with its old replicas", tick)
        tl.mark("all_up")
        wait(lambda: w["kcm"].ready() >= 1, 60, "KCM running again", tick)
        hold(10, tick)
        show(
            f"KCM in the loop: during the {tl.since('cut', 'heal'):.0f}s cut at most "
            f"{outcome['unknown']} nodes Unknown, at least {outcome['min_endpoints']}/{nodes} endpoints ready"
        )
        annotations = [
            d["metadata"].get("annotations") or {}
            for d in seed_admin.get(DEPLOYMENTS.format(ns=NAMESPACE))["items"]
        ]
        marks = (RECORD, REPLICAS, MELTDOWN)
        leftover = [a for a in annotations if any(k in marks for k in a)]
        show(f"restored {replicas()}; controllers still carrying a record: {len(leftover)}")
        return {
            "last_renewal_to_mcm_down_s": (mcm_down_wall - last_renewal).total_seconds(),
            "last_renewal_to_kcm_down_s": (all_down_wall - last_renewal).total_seconds(),
            "cut_to_mcm_down_s": tl.since("cut", "mcm_down"),
            "cut_to_all_down_s": tl.since("cut", "all_down"),
            "heal_to_all_up_s": tl.since("heal", "all_up"),
            "nodes_unknown_max": float(outcome["unknown"]),
            "endpoints_ready_min": float(outcome["min_endpoints"]),
        }
