"""A move from the old layout (leases named like their nodes in dwd-node-lease) to kube-system,
as an upgrade rolls it out: the DaemonSet replaces its agents a few at a time, and the aggregator
is upgraded before or after them. Nothing may be lowered, and nothing is left in the old place.

The kubelets' leases are not renewed here: the second witness would see every node silent and
so could not cover a gap in the leases; the last step shows that this world does scale down
when the agents really stop. The old agents are stand-ins that write what the old agent wrote
(merge patches of holderIdentity and renewTime); the old aggregator is not run: in the
agents-first order, what it would judge (the old leases) is sampled instead.
"""

from __future__ import annotations

import functools
import math
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.errors import NotFound
from core.lease import (
    LEGACY_LEASE_NAMESPACE,
    RELEASED,
    lease_path,
    leases_path,
    parse_micro_time,
    release_patch,
)
from testenv.base.kapi import Client, node_leases
from testenv.base.poller import Poller
from testenv.base.process import Process
from testenv.base.wait import wait_for
from testenv.gardener.apply import apply, kustomize_build
from testenv.kube.controllers import CONTROLLERS, DOWN
from testenv.kube.controlplane import ensure_namespace, free_port
from testenv.kube.kcm import KcmReplicas
from testenv.kube.standins import LeaseDriver
from testenv.worlds.agents import ByUrl, start_agent
from testenv.worlds.shoot_world import Shoot

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OLD = LEGACY_LEASE_NAMESPACE
NODES = [f"node-{i}" for i in range(6)]
ROLL = 2  # agents replaced at a time (the DaemonSet's maxUnavailable)
ROLL_EVERY_S = 3.0


def old_agents(client: Client) -> LeaseDriver:
    """The old agents: each renews ``dwd-node-lease/<node>`` while its node is in ``alive``."""
    return LeaseDriver(client, NODES, path=functools.partial(lease_path, OLD))


class Ages(Poller):
    """Every 200 ms: the oldest renewal per place, and the oldest of what the new aggregator
    judges (each node's later renewal of the two). A released lease is left out, as both
    aggregators leave it out: its agent stopped on purpose and its successor is starting."""

    def __init__(self, client: Client) -> None:
        super().__init__("lease-ages", 0.2)
        self.client = client
        self.oldest_judged = 0.0
        self.oldest_old = 0.0
        self.both_written: dict[str, float] = {}  # node -> when both places were first seen renewed

    def close(self) -> None:
        self.client.close()

    def step(self) -> None:
        now = datetime.now(UTC)
        new = {n: _age(now, lease) for n, lease in node_leases(self.client).items() if not _released(lease)}
        try:
            items = self.client.get(leases_path(OLD))["items"]
        except NotFound:
            items = []
        old = {i["metadata"]["name"]: _age(now, i) for i in items if not _released(i)}
        for node in NODES:
            if node in old:
                self.oldest_old = max(self.oldest_old, old[node])
            judged = min(old.get(node, math.inf), new.get(node, math.inf))
            if judged < math.inf:
                self.oldest_judged = max(self.oldest_judged, judged)
            if new.get(node, math.inf) < 1 and old.get(node, math.inf) < 1:
                self.both_written.setdefault(node, time.monotonic())


class Candidates(Poller):
    """The aggregator's verdict every 200 ms, from /status: how many nodes it judges (a node
    whose agent restarts is left out, released) and how many of them it finds stale."""

    def __init__(self, port: int) -> None:
        super().__init__("candidates", 0.2)
        self.port = port
        self.seen: list[int] = []
        self.stale: list[int] = []

    def step(self) -> None:
        judged, stale = verdict(self.port)
        self.seen.append(judged)
        self.stale.append(stale)


def verdict(port: int) -> tuple[int, int]:
    """(candidates, stale) of the one target; (-1, -1) while it has none to give."""
    try:
        targets = httpx.get(f"http://127.0.0.1:{port}/status", trust_env=False, timeout=2).json()["targets"]
    except (httpx.HTTPError, ValueError):
        return -1, -1
    if not targets or targets[0]["phase"] == "starting":
        return -1, -1
    return int(targets[0]["candidates"]), int(targets[0]["stale"])


def candidates(port: int) -> int:
    return verdict(port)[0]


def _all_renewed(admin: Client) -> bool:
    return all((i.get("spec") or {}).get("renewTime") for i in admin.get(leases_path(OLD))["items"])


def _gone(admin: Client, path: str) -> bool:
    try:
        admin.get(path)
    except NotFound:
        return True
    return False


def _released(lease: dict[str, Any]) -> bool:
    return (lease["metadata"].get("annotations") or {}).get(RELEASED) == "true"


def _age(now: datetime, lease: dict[str, Any]) -> float:
    renew = (lease.get("spec") or {}).get("renewTime")
    return (now - parse_micro_time(renew)).total_seconds() if renew else float("inf")


def install_old_layout(shoot: Shoot) -> None:
    """What the old install left in a shoot: its namespace, a lease per node, the agent's Role
    there bound to kube-system/dwd-lease-agent (as the Gardener overlay bound it)."""
    admin = shoot.shoot_admin
    ensure_namespace(admin, OLD)
    for node in NODES:
        uid = admin.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
        admin.ensure(
            leases_path(OLD),
            {
                "metadata": {
                    "name": node,
                    "annotations": {"dependency-watchdog.gardener.cloud/renew-interval": "500ms"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
                },
                "spec": {"leaseDurationSeconds": 2},
            },
        )
    rules = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["patch"]}]
    admin.ensure(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{OLD}/roles",
        {"metadata": {"name": "dwd-lease-agent"}, "rules": rules},
    )
    admin.ensure(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{OLD}/rolebindings",
        {
            "metadata": {"name": "dwd-lease-agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "dwd-lease-agent"},
            "subjects": [{"kind": "ServiceAccount", "name": "dwd-lease-agent", "namespace": "kube-system"}],
        },
    )
    # The new shoot part: the agent's RBAC, its policy (which covers the old place too).
    apply(
        admin, [d for d in kustomize_build(ROOT / "manifests" / "shoot" / "base") if d["kind"] != "DaemonSet"]
    )


def new_agent(shoot: Shoot, node: str, source: Path | None = None) -> Process:
    """The agent of ``node`` as its pod runs it: this release's, or another's (``source``, its
    own files: both may run for one node in a test)."""
    which = "-previous" if source else ""
    token = shoot.tmp / f"token-{node}{which}"
    token.write_text(shoot.shoot.node_token(node, namespace="kube-system", service_account="dwd-lease-agent"))
    env = {"PATH": os.environ.get("PATH", ""), "DWD_RENEW_INTERVAL": "500ms", "DWD_LOG_FORMAT": "json"}
    return start_agent(
        node,
        token_file=token,
        server=ByUrl(shoot.shoot.url, shoot.shoot.ca_file),
        log_path=shoot.tmp / f"agent-{node}{which}.log",
        env=env,
        source=source,
    )


def roll(shoot: Shoot, old: LeaseDriver, agents: list[Process]) -> None:
    """The DaemonSet's rolling update (maxUnavailable): ROLL old agents stop, each marking its
    lease released as the old agent did on SIGTERM; their new ones start (into ``agents``, the
    caller's to stop even when the roll fails); the next ROLL only once these renew (a new pod
    available), and at least ROLL_EVERY_S later."""
    for i in range(0, len(NODES), ROLL):
        batch = NODES[i : i + ROLL]
        started = datetime.now(UTC)
        for node in batch:
            old.alive.discard(node)
            shoot.shoot_admin.merge_patch(lease_path(OLD, node), release_patch())
            agents.append(new_agent(shoot, node))
        wait_for(
            functools.partial(_renewed_since, shoot.shoot_admin, batch, started), 30, f"{batch} renewing"
        )
        time.sleep(ROLL_EVERY_S)


def _renewed_since(admin: Client, nodes: list[str], since: datetime) -> bool:
    """Each node's lease of either layout renewed since ``since``."""
    new = node_leases(admin)
    old = {i["metadata"]["name"]: i for i in admin.get(leases_path(OLD))["items"]}
    for node in nodes:
        stamps = [
            (lease.get("spec") or {}).get("renewTime") for lease in (new.get(node), old.get(node)) if lease
        ]
        if not any(t and parse_micro_time(t) > since for t in stamps):
            return False
    return True


def finish(shoot: Shoot, agents: list[Process]) -> None:
    """The move's last step: the old namespace deleted (a KCM's namespace controller empties
    it); the agents stop writing there."""
    admin = shoot.shoot_admin
    kcm = KcmReplicas(shoot.shoot, shoot.tmp / "kcm")
    kcm.scale(1)
    try:
        admin.delete(f"/api/v1/namespaces/{OLD}")
        wait_for(lambda: _gone(admin, f"/api/v1/namespaces/{OLD}"), 60, "the old namespace gone")
    finally:
        kcm.scale(0)
    wait_for(
        lambda: all(b"legacy_lease_done" in a.log_path.read_bytes() for a in agents),
        20,
        "every agent to stop renewing the old place",
    )


def start_old_layout(shoot: Shoot) -> tuple[LeaseDriver, Ages, Any]:
    """Six nodes of the old layout, their old agents renewing; the ages and the controllers
    sampled (not started yet: ``Ages``)."""
    shoot.setup(nodes=0)
    for node in NODES:
        shoot.shoot_admin.ensure("/api/v1/nodes", {"metadata": {"name": node}})
    shoot.driver.alive.clear()
    install_old_layout(shoot)
    old, ages, sampler = (
        old_agents(shoot.shoot.admin_client()),
        Ages(shoot.shoot.admin_client()),
        shoot.sampler(),
    )
    old.start()
    return old, ages, sampler


def test_aggregator_first_then_the_agents(shoot: Shoot) -> None:
    old, ages, sampler = start_old_layout(shoot)
    agents: list[Process] = []
    port = free_port()
    judged = Candidates(port)
    try:
        agg = shoot.start_aggregator({"DWD_METRICS_ADDR": f"127.0.0.1:{port}"})
        wait_for(lambda: len(node_leases(shoot.shoot_admin)) == len(NODES), 30, "our leases provisioned")
        # Every node judged by its old lease alone, for two lease durations.
        wait_for(lambda: candidates(port) == len(NODES), 30, "every node judged")
        time.sleep(4)
        ages.start()
        judged.start()
        started = time.monotonic()
        roll(shoot, old, agents)
        wait_for(lambda: len(ages.both_written) == len(NODES), 20, "every node renewing both places")
        finish(shoot, agents)
        both_s = time.monotonic() - min(ages.both_written.values())
        time.sleep(2)
        ages.stop()
        judged.stop()
        report(
            "aggregator first", time.monotonic() - started, both_s, ages=ages, sampler=sampler, judged=judged
        )
        assert_nothing_lowered(sampler)
        # Only the agents restarting at the time are left out; no node is ever judged stale.
        assert min(judged.seen) >= len(NODES) - ROLL, judged.seen
        assert max(judged.stale) == 0, judged.stale
        assert ages.oldest_judged < 2.0  # the lease duration: no node ever looked stale
        still_scales_down(shoot, agents, agg)
    finally:
        old.stop()
        ages.stop()
        judged.stop()
        for a in agents:
            a.kill()


def test_agents_first_then_the_aggregator(shoot: Shoot) -> None:
    old, ages, sampler = start_old_layout(shoot)
    wait_for(lambda: _all_renewed(shoot.shoot_admin), 10, "the old agents renewing")
    ages.start()
    judged = Candidates(0)
    agents: list[Process] = []
    try:
        started = time.monotonic()
        # No lease of ours yet (an old aggregator provisions none): the new agents keep the old
        # leases renewed, at their pace, for the old aggregator to judge.
        roll(shoot, old, agents)
        time.sleep(4)
        assert ages.oldest_old < 2.0, (
            f"an old lease reached {ages.oldest_old:.1f}s: the old aggregator would act"
        )
        port = free_port()
        agg = shoot.start_aggregator({"DWD_METRICS_ADDR": f"127.0.0.1:{port}"})
        wait_for(lambda: len(ages.both_written) == len(NODES), 30, "every node renewing both places")
        wait_for(lambda: candidates(port) == len(NODES), 30, "every node judged")
        judged.port = port
        judged.start()
        finish(shoot, agents)
        both_s = time.monotonic() - min(ages.both_written.values())
        time.sleep(2)
        ages.stop()
        judged.stop()
        report("agents first", time.monotonic() - started, both_s, ages=ages, sampler=sampler, judged=judged)
        assert_nothing_lowered(sampler)
        # Only the agents restarting at the time are left out; no node is ever judged stale.
        assert min(judged.seen) >= len(NODES) - ROLL, judged.seen
        assert max(judged.stale) == 0, judged.stale
        assert ages.oldest_judged < 2.0
        still_scales_down(shoot, agents, agg)
    finally:
        old.stop()
        ages.stop()
        judged.stop()
        for a in agents:
            a.kill()


def report(order: str, took_s: float, both_s: float, *, ages: Ages, sampler: Any, judged: Candidates) -> None:
    lowered = sum(1 for s in sampler.samples if any(s.replicas[n] < CONTROLLERS[n] for n in CONTROLLERS))
    print(
        f"\n{order}: move {took_s:.1f}s, both places written {both_s:.1f}s, oldest old lease "
        f"{ages.oldest_old:.2f}s, oldest lease judged {ages.oldest_judged:.2f}s (duration 2s), "
        f"nodes judged {min(judged.seen)}..{max(judged.seen)} of {len(NODES)}, "
        f"at most {max(judged.stale)} stale, "
        f"samples with a controller lowered: {lowered} of {len(sampler.samples)}"
    )


def assert_nothing_lowered(sampler: Any) -> None:
    low = [s for s in sampler.samples if any(s.replicas[n] < CONTROLLERS[n] for n in CONTROLLERS)]
    assert not low, f"lowered during the move: {low[0].replicas}"


def still_scales_down(shoot: Shoot, agents: list[Process], agg: Process) -> None:
    """The control: the same world scales down once the agents really stop (no kubelet renews
    its lease here, so the witness cannot be what kept it up during the move)."""
    for a in agents:
        a.kill()
    wait_for(lambda: shoot.replicas() == DOWN, 30, f"the scale-down when every agent stops ({agg.log_path})")
