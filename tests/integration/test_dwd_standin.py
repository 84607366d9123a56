"""The DWD v1.7.0 prober stand-in (testenv/gardener/prober_standin.py) against a real shoot and seed API
server.

What the real DWD does, checked on the stand-in: kubelet leases (NodeLeaseDriver) judged at
0.75 x KCM's grace, scale-down marks and order, scale-up that keeps ``replicas`` for ever, any
dependent at 0 raised, ignore-scaling. The pure parts are checked first, without a server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.errors import ConfigError
from core.lease import format_micro_time
from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.gardener.prober_standin import (
    GARDENER_DEPENDENTS,
    IGNORE_SCALING,
    MELTDOWN,
    NOT_MANAGED_BY_MCM,
    REPLICAS,
    ProberPanic,
    ProberStandIn,
    ScaleError,
    candidate_leases,
    ignores_scaling,
    judge_leases,
    judge_nodes,
    scale_flows,
    target_replicas,
)
from testenv.kube.controllers import CA, DOWN, KCM, MCM
from testenv.kube.controlplane import ControlPlane
from testenv.kube.standins import DEPLOYMENTS
from testenv.worlds.shoot_world import FAST_DEPENDENTS, Shoot
from tests.integration.dwdworld import FAST, NODES, DwdWorld

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
FAST_REF = {"kind": "Deployment", "name": KCM, "apiVersion": "apps/v1"}


# --- the pure parts ---------------------------------------------------------------------------


def _node(name: str, **meta: Any) -> dict[str, Any]:
    conditions = meta.pop("conditions", [])
    return {"metadata": {"name": name, **meta}, "status": {"conditions": conditions}}


def _lease(name: str, renewed_s_ago: float | None) -> dict[str, Any]:
    spec = (
        {}
        if renewed_s_ago is None
        else {"renewTime": format_micro_time(NOW - timedelta(seconds=renewed_s_ago))}
    )
    return {"metadata": {"name": name}, "spec": spec}


def test_pure_candidates_leave_out_unmanaged_unhealthy_updating_and_failed_machines() -> None:
    nodes = [
        _node("ok"),
        _node("unmanaged", annotations={NOT_MANAGED_BY_MCM: "false"}),  # presence is enough
        _node("disk", conditions=[{"type": "DiskPressure", "status": "True"}]),
        _node("disk-false", conditions=[{"type": "DiskPressure", "status": "False"}]),
        _node(
            "updating", conditions=[{"type": "InPlaceUpdate", "status": "True", "reason": "ReadyForUpdate"}]
        ),
        _node(
            "pool", labels={"worker.gardener.cloud/pool": "p"}, conditions=[{"type": "X", "status": "True"}]
        ),
    ]
    verdicts = {v.name: v for v in judge_nodes(nodes, None, {"p": ["X"]})}
    assert [n for n, v in verdicts.items() if v.candidate] == ["ok", "disk-false"]
    assert not verdicts["unmanaged"].managed_by_mcm
    assert not verdicts["disk"].healthy
    assert verdicts["updating"].in_place_update
    assert not verdicts["pool"].healthy

    machines = [
        {"metadata": {"labels": {"node": "ok"}}, "status": {"currentStatus": {"phase": "Running"}}},
        {
            "metadata": {"labels": {"node": "disk-false"}},
            "status": {"currentStatus": {"phase": "Terminating"}},
        },
    ]
    with_machines = judge_nodes(nodes, machines)
    assert [v.name for v in with_machines if v.candidate] == ["ok"]
    leases = [_lease("ok", 0), _lease("gone-node", 0), _lease("disk", 0)]
    assert [x["metadata"]["name"] for x in candidate_leases(leases, with_machines)] == ["ok"]


def test_pure_lease_judgement() -> None:
    grace = 40.0  # expired at 30 s
    at_boundary = [_lease("a", 30.0), _lease("b", 29.999)]
    assert judge_leases(at_boundary, NOW, grace, 0.6).expired == 1
    six = [_lease(f"n{i}", 31 if i < 6 else 1) for i in range(10)]
    assert judge_leases(six, NOW, grace, 0.6).action == "scale-down"  # 0.6 is not < 0.6
    five = [_lease(f"n{i}", 31 if i < 5 else 1) for i in range(10)]
    assert judge_leases(five, NOW, grace, 0.6).action == "scale-up"
    assert judge_leases([], NOW, grace, 0.6).action == "scale-up"
    # One candidate: no scaling, its renewTime not even read.
    assert judge_leases([_lease("a", None)], NOW, grace, 0.6).action == "no-scaling"
    with pytest.raises(ProberPanic):
        judge_leases([_lease("a", None), _lease("b", 1)], NOW, grace, 0.6)


def test_pure_flows_annotations_and_config() -> None:
    gardener = scale_flows(GARDENER_DEPENDENTS)
    assert [[s.ref.name for s in level] for level in gardener["scale-down"]] == [[MCM, CA], [KCM]]
    assert [[s.ref.name for s in level] for level in gardener["scale-up"]] == [[KCM], [MCM], [CA]]
    mcm_up = gardener["scale-up"][1][0]
    assert (mcm_up.initial_delay_s, mcm_up.timeout_s, mcm_up.optional) == (30.0, 30.0, False)
    assert gardener["scale-up"][2][0].optional
    fast = scale_flows(FAST_DEPENDENTS)
    assert fast["scale-up"][1][0].initial_delay_s == 0.5
    assert fast["scale-up"][1][0].ref.object_path("ns") == f"/apis/apps/v1/namespaces/ns/deployments/{MCM}"

    bad = {"dependentResourceInfos": [{"ref": {"kind": "Deployment"}}, {"ref": FAST_REF, "scaleUp": {}}]}
    with pytest.raises(ConfigError) as err:
        scale_flows(bad)
    assert len(err.value.problems) == 2  # every problem at once

    assert target_replicas({REPLICAS: "3"}) == 3
    assert target_replicas({}) == 1
    with pytest.raises(ScaleError):
        target_replicas({REPLICAS: "three"})
    assert [ignores_scaling({IGNORE_SCALING: v}) for v in ("true", "True", "1", "t", "yes", "")] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]


# --- against the API servers ------------------------------------------------------------------


def marks_of(shoot: Shoot, name: str) -> dict[str, str]:
    return dict(shoot.deployments()[name]["metadata"].get("annotations") or {})


def set_replicas(shoot: Shoot, name: str, replicas: int, *, wait: bool = True) -> None:
    path = f"{DEPLOYMENTS.format(ns=shoot.namespace)}/{name}/scale"
    shoot.seed_admin.merge_patch(path, {"spec": {"replicas": replicas}})
    if wait:
        wait_for(lambda: shoot.ready_replicas()[name] == replicas, 5, f"{name} ready at {replicas}")


def lose_quorum_and_scale_down(w: DwdWorld) -> float:
    """7 of 10 kubelet leases stop; returns when DWD's probe has scaled down (its start time)."""
    w.kubelets.alive = set(NODES[7:])
    wait_for(lambda: w.dwd.verdict().action == "scale-down", 5, "7 leases expired", every_s=0.1)
    started = len(w.dwd.writes)
    assert w.dwd.probe_once() == "scale-down"
    return w.dwd.writes[started].t


def test_healthy_shoot_probe_scales_up_and_writes_nothing(world_for: Callable[..., DwdWorld]) -> None:
    w = world_for()
    verdict = w.dwd.verdict()
    assert (verdict.action, verdict.candidates, verdict.expired) == ("scale-up", 10, 0)
    assert w.dwd.probe_once() == "scale-up"
    assert w.dwd.writes == []
    assert w.shoot.replicas() == {KCM: 3, MCM: 2, CA: 1}
    assert all(not marks_of(w.shoot, n) for n in (KCM, MCM, CA))


def test_quorum_lost_marks_then_zeroes_mcm_and_ca_before_kcm(world_for: Callable[..., DwdWorld]) -> None:
    w = world_for()
    set_replicas(w.shoot, KCM, 4)  # the replicas "at that moment", not the configured ones
    lose_quorum_and_scale_down(w)

    assert w.shoot.replicas() == DOWN
    for name, before in ((KCM, "4"), (MCM, "2"), (CA, "1")):
        writes = w.dwd.writes_to(name)
        assert [x.method for x in writes] == ["PATCH", "PUT"], name
        assert writes[0].body == {"metadata": {"annotations": {REPLICAS: before, MELTDOWN: ""}}}
        assert writes[1].path.endswith(f"/deployments/{name}/scale")
        assert writes[1].body["spec"]["replicas"] == 0
        marks = marks_of(w.shoot, name)
        assert (marks[REPLICAS], marks[MELTDOWN]) == (before, "")
    level0 = w.dwd.writes_to(MCM) + w.dwd.writes_to(CA)
    assert max(x.t for x in level0) < min(x.t for x in w.dwd.writes_to(KCM))
    # MCM and CA in parallel: both started before either finished its ~1 s readiness wait.
    assert abs(w.dwd.writes_to(MCM)[0].t - w.dwd.writes_to(CA)[0].t) < 0.5
    # Already at 0: the next failing probe changes nothing.
    n = len(w.dwd.writes)
    assert w.dwd.probe_once() == "scale-down"
    assert len(w.dwd.writes) == n


def test_quorum_back_restores_counts_and_keeps_replicas_mark(world_for: Callable[..., DwdWorld]) -> None:
    w = world_for()
    set_replicas(w.shoot, KCM, 4)
    lose_quorum_and_scale_down(w)

    w.kubelets.alive = set(NODES)
    wait_for(lambda: w.dwd.verdict().action == "scale-up", 5, "leases renewed again", every_s=0.1)
    recovered = time.monotonic()
    assert w.dwd.probe_once() == "scale-up"

    assert w.shoot.replicas() == {KCM: 4, MCM: 2, CA: 1}
    for name, before in ((KCM, "4"), (MCM, "2"), (CA, "1")):
        up = [x for x in w.dwd.writes_to(name) if x.t >= recovered]
        assert [x.method for x in up] == ["PUT", "PATCH"], name
        assert up[0].body["spec"]["replicas"] == int(before)
        assert up[1].body == {"metadata": {"annotations": {MELTDOWN: None}}}
        marks = marks_of(w.shoot, name)
        assert MELTDOWN not in marks
        assert marks[REPLICAS] == before  # DWD v1.7.0 never removes it
    first = {n: min(x.t for x in w.dwd.writes_to(n) if x.t >= recovered) for n in (KCM, MCM, CA)}
    assert first[KCM] < first[MCM] < first[CA]  # levels 0, 1 (after 0.5 s), 2
    n = len(w.dwd.writes)
    assert w.dwd.probe_once() == "scale-up"
    assert len(w.dwd.writes) == n


def test_any_dependent_at_zero_is_raised_by_a_passing_probe(world_for: Callable[..., DwdWorld]) -> None:
    w = world_for(controllers={KCM: 3, MCM: 0, CA: 1})
    assert marks_of(w.shoot, MCM) == {}
    assert w.dwd.probe_once() == "scale-up"
    assert w.shoot.replicas() == {KCM: 3, MCM: 1, CA: 1}
    assert [x.method for x in w.dwd.writes_to(MCM)] == ["PUT", "PATCH"]  # the removal is unconditional
    assert w.dwd.writes_to(KCM) == w.dwd.writes_to(CA) == []
    assert marks_of(w.shoot, MCM) == {}


def test_ignore_scaling_is_not_scaled_and_loses_its_meltdown_mark(world_for: Callable[..., DwdWorld]) -> None:
    w = world_for(
        controllers={KCM: 0, MCM: 2, CA: 1},
        annotations={KCM: {IGNORE_SCALING: "true", MELTDOWN: ""}, CA: {MELTDOWN: ""}},
    )
    assert w.dwd.probe_once() == "scale-up"
    assert w.shoot.replicas() == {KCM: 0, MCM: 2, CA: 1}
    assert marks_of(w.shoot, KCM) == {IGNORE_SCALING: "true"}
    assert marks_of(w.shoot, CA) == {}  # a leftover mark on a running dependent goes too
    assert [x.body for x in w.dwd.writes_to(KCM)] == [{"metadata": {"annotations": {MELTDOWN: None}}}]
    assert [x.method for x in w.dwd.writes_to(CA)] == ["PATCH"]
    assert w.dwd.writes_to(MCM) == []


def test_loop_raises_mcm_each_time_it_is_lowered(world_for: Callable[..., DwdWorld]) -> None:
    w = world_for(controllers={KCM: 3, MCM: 0, CA: 1})
    w.dwd.start()

    def raised_times(n: int) -> Callable[[], bool]:
        return lambda: len(w.dwd.scaled(MCM)) == n

    def probe_ended_after(t: float) -> Callable[[], bool]:
        return lambda: any(p.ended > t for p in w.dwd.probes)

    for raised in (1, 2, 3):
        wait_for(raised_times(raised), 10, f"MCM raised {raised} times")
        wait_for(probe_ended_after(w.dwd.writes_to(MCM)[-1].t), 10, "that probe ended")
        if raised < 3:
            set_replicas(w.shoot, MCM, 0, wait=False)  # whoever lowered it, DWD raises it again
    w.dwd.stop()
    assert w.dwd.scaled(MCM) == [1, 1, 1]
    assert w.dwd.scaled(KCM) == w.dwd.scaled(CA) == []
    # JitterUntil, sliding: each probe starts interval x (1 + up to 0.2) after the last one ended.
    gaps = [b.started - a.ended for a, b in zip(w.dwd.probes, w.dwd.probes[1:], strict=False)]
    assert gaps
    assert all(0.3 <= g <= 0.36 + 0.1 for g in gaps), gaps


def test_unreachable_shoot_skips_the_probe(seed_plane: ControlPlane) -> None:
    with (
        Client("https://127.0.0.1:1", str(seed_plane.ca_file), timeout_s=2) as nowhere,
        seed_plane.admin_client() as seed,
    ):
        dwd = ProberStandIn(nowhere, seed, "shoot--t--unreachable", **FAST)
        assert dwd.probe_once().startswith("skipped: probe API server failed")
    assert dwd.writes == []
    assert [p.decision.split(":")[0] for p in dwd.probes] == ["skipped"]
