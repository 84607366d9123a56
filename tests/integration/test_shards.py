"""Two aggregators sharing six targets over four shard Leases on the real seed API server: the
first takes every shard and hands half to the second while both run; each target's writes
come from one replica, both act in the same outage, and a replica killed with SIGKILL leaves
its shards to the other within a lease duration, which restores every target."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import yaml

from aggregator.lead.leader import ROLE
from aggregator.lead.shards import shard_of
from aggregator.model.records import MELTDOWN
from testenv.base.process import Process
from testenv.base.wait import wait_for
from testenv.kube.controllers import CONTROLLERS, DOWN
from testenv.kube.controlplane import ensure_namespace
from testenv.kube.standins import DEPLOYMENTS, DeploymentController, deployment
from testenv.worlds.chain import epoch
from testenv.worlds.shoot_world import ACCESS_SECRET, Shoot

FILE_MODE = {"DWD_SHOOT_KUBECONFIG": "", "DWD_NAMESPACE": ""}
SHARDS = 4


def replicas(shoot: Shoot, ns: str) -> dict[str, int]:
    items = shoot.seed_admin.get(DEPLOYMENTS.format(ns=ns))["items"]
    return {d["metadata"]["name"]: int(d["spec"]["replicas"]) for d in items}


def shard_holders(shoot: Shoot) -> dict[str, str]:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{shoot.namespace}/leases"
    items = shoot.seed_admin.get(path, labelSelector=f"{ROLE}=shard")["items"]
    return {i["metadata"]["name"]: str(i["spec"].get("holderIdentity") or "") for i in items}


def recorded(shoot: Shoot, ns: str) -> bool:
    items = shoot.seed_admin.get(DEPLOYMENTS.format(ns=ns))["items"]
    return any(MELTDOWN in (d["metadata"].get("annotations") or {}) for d in items)


def writers(aggregators: list[Process], since: float) -> dict[str, set[int]]:
    """Per target, which of ``aggregators`` scaled any of its dependents after ``since``."""
    out: dict[str, set[int]] = collections.defaultdict(set)
    for i, agg in enumerate(aggregators):
        for e in agg.events():
            if e["event"] == "resource_scaling" and epoch(e["timestamp"]) > since:
                out[e["target"]].add(i)
    return out


def test_two_replicas_share_the_targets_and_one_takes_the_others_share_when_it_dies(
    shoot: Shoot, tmp_path: Path
) -> None:
    shoot.setup()
    access: dict[str, Any] = shoot.aggregator_access("agg-token")
    # Six targets on the same shoot: each its own control-plane namespace of the seed.
    namespaces = [shoot.namespace] + [f"{shoot.namespace[:50]}-{i}" for i in range(1, 6)]
    controllers = []
    for ns in namespaces:
        if ns != shoot.namespace:
            ensure_namespace(shoot.seed_admin, ns)
            for name, count in CONTROLLERS.items():
                shoot.seed_admin.create(DEPLOYMENTS.format(ns=ns), deployment(name, count))
            controllers.append(DeploymentController(shoot.seed.admin_client(), ns))
            controllers[-1].start()
        shoot.namespace, home = ns, shoot.namespace
        shoot.store_access(access, ACCESS_SECRET)
        shoot.namespace = home
    assert len({shard_of(ns, SHARDS) for ns in namespaces}) >= 2  # the test means something
    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump({"targets": [{"namespace": ns} for ns in namespaces]}))
    env = {**shoot.election_env(), **FILE_MODE, "DWD_TARGETS": f"file:{targets}", "DWD_SHARDS": str(SHARDS)}
    try:
        a = shoot.start_aggregator(env)
        wait_for(
            lambda: (
                set(shard_holders(shoot).values()) == {_identity(a)} and len(shard_holders(shoot)) == SHARDS
            ),
            30,
            "the first replica to take every shard",
            every_s=0.5,
        )
        # The second replica's share is handed over by the first while both run.
        b = shoot.start_aggregator(env)
        wait_for(
            lambda: sorted(collections.Counter(shard_holders(shoot).values()).values()) == [2, 2],
            40,
            "two shards each",
            every_s=0.5,
        )
        # From here the shards stay put until a dies. Before, a write may move with its shard:
        # an orphan other tests left was restored half by a, half by b after the handover.
        settled = time.time()
        assert any(e["event"] == "lease_given_back" for e in a.events())
        shoot.wait_leases_renewed()
        time.sleep(4)  # every target's view fresh for a lease duration

        shoot.driver.alive -= {f"node-{i}" for i in range(8)}
        wait_for(
            lambda: all(replicas(shoot, ns) == DOWN for ns in namespaces),
            40,
            "every target down",
            every_s=0.2,
        )
        # The seed is shared with other tests: a record one of them left in a namespace no
        # target serves is swept by its shard's holder, one writer too.
        every = writers([a, b], since=settled)
        assert all(len(w) == 1 for w in every.values()), every  # one writer a namespace
        wrote = {ns: w for ns, w in every.items() if ns in namespaces}
        assert set(wrote) == set(namespaces)
        assert {i for w in wrote.values() for i in w} == {0, 1}  # and the work split
        a.kill()  # SIGKILL: a's shards are not given back
        killed_at = time.monotonic()
        shoot.driver.alive |= {f"node-{i}" for i in range(8)}
        wait_for(
            lambda: all(replicas(shoot, ns) == CONTROLLERS for ns in namespaces),
            60,
            "every target restored by the survivor",
            every_s=0.2,
        )
        # a leader lease duration (election_env's 4 s) until its shards are free, then a tick
        # and the levels up.
        assert time.monotonic() - killed_at < 4 + 12
        wait_for(lambda: not any(recorded(shoot, ns) for ns in namespaces), 20, "every record removed")
        assert set(shard_holders(shoot).values()) == {_identity(b)}
        assert any(e["event"] == "shards_changed" and len(e["held"]) == SHARDS for e in b.events())
    finally:
        for c in controllers:
            c.stop()


def _identity(agg: Process) -> str:
    """The replica's identity, as it logs at start ("" until it has)."""
    return next((e["identity"] for e in agg.events() if e["event"] == "aggregator_started"), "")
