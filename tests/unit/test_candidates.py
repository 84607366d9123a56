"""dependency-watchdog's candidate rules that read more than a node's metadata: its Machine's
phase, an in-place update, its pool's unhealthy conditions; each on /status, in the verdict and
in the estimate, and what an unreadable seed means."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from aggregator.act.interlocks import Interlock
from aggregator.decide.decider import Look, decide
from aggregator.kube.client import METADATA_ONLY
from aggregator.lead.scope import Scope
from aggregator.model.candidates import DEFAULT_CONDITIONS, NodeConditions, phases_by_node, pools_of_workers
from aggregator.model.eligibility import skipped
from aggregator.model.lifecycle import ClusterView
from aggregator.model.objects import NodeView
from aggregator.model.observed import LeaseObs, NodeObs
from aggregator.model.settings import DeciderSettings, Settings
from aggregator.model.verdict import Memory, Phase
from aggregator.observe.machines import ABSENT, MACHINES
from aggregator.observe.sources import GardenerSource
from aggregator.observe.watcher import Observed
from aggregator.shoot import Shared
from aggregator.target import Target
from core.errors import ConfigError, KubeError, api_error
from core.lease import LeaseView
from testenv.gardener.seed_objects import cluster
from tests.unit.fakekube import FakeKube, Rule, server_error
from tests.unit.world import NS, World

NOW = 1000.0


def machine(w: World, node: str, phase: str, *, name: str = "") -> None:
    """The node's Machine in the seed, as MCM labels it (``node=<name>``)."""
    w.seed.put(
        f"{MACHINES.format(namespace=NS)}/{name or 'm-' + node}",
        {"metadata": {"labels": {"node": node}}, "status": {"currentStatus": {"phase": phase}}},
    )


def condition(w: World, node: str, kind: str, status: str, *, reason: str = "", pool: str = "") -> None:
    obj = w.shoot.objects[f"/api/v1/nodes/{node}"]
    obj.setdefault("status", {}).setdefault("conditions", []).append(
        {"type": kind, "status": status, "reason": reason}
    )
    if pool:
        obj["metadata"].setdefault("labels", {})["worker.gardener.cloud/pool"] = pool


def forbidden() -> KubeError:
    return api_error(403, '{"reason":"Forbidden","message":"machines is forbidden"}')


# -- each rule, on /status


async def test_each_rule_leaves_its_node_out_and_says_why_on_the_status_page() -> None:
    w = World(9)
    n = w.names
    machine(w, n[0], "Failed")
    machine(w, n[1], "Terminating")
    machine(w, n[2], "Running")
    condition(w, n[3], "InPlaceUpdate", "True", reason="ReadyForUpdate")
    condition(w, n[4], "InPlaceUpdate", "False", reason="UpdateFailed")  # the reason decides
    condition(w, n[5], "DiskPressure", "True")
    condition(w, n[6], "InPlaceUpdate", "True", reason="CandidateForUpdate")  # still runs workloads
    condition(w, n[7], "DiskPressure", "False")
    condition(w, n[8], "Ready", "True")
    await w.run(12)
    snap = w.target.snapshot()
    assert snap["skipped"] == {
        n[0]: "machine Failed",
        n[1]: "machine Terminating",
        n[3]: "in-place update",
        n[4]: "in-place update",
        n[5]: "an unhealthy condition (DiskPressure)",
    }
    assert snap["candidates"] == 4
    assert snap["machines"] == {"rule": "on", "error": "", "age_s": pytest.approx(11.0)}


async def test_a_pools_own_list_applies_to_that_pool_only() -> None:
    """gpu's list replaces the default for gpu's nodes; every other pool keeps DWD's four."""
    w = World(6, node_conditions=NodeConditions.parse("gpu: [GPUUnhealthy]"))
    n = w.names
    condition(w, n[0], "GPUUnhealthy", "True", pool="gpu")
    condition(w, n[1], "GPUUnhealthy", "True", pool="cpu")
    condition(w, n[2], "DiskPressure", "True", pool="gpu")
    condition(w, n[3], "DiskPressure", "True", pool="cpu")
    condition(w, n[4], "KernelDeadlock", "True")  # no pool label: the default
    await w.run(12)
    assert w.target.snapshot()["skipped"] == {
        n[0]: "an unhealthy condition (GPUUnhealthy)",
        n[3]: "an unhealthy condition (DiskPressure)",
        n[4]: "an unhealthy condition (KernelDeadlock)",
    }


async def test_off_reads_no_node_status_and_watches_the_nodes_as_metadata_only() -> None:
    w = World(4, node_conditions=None)
    condition(w, w.names[0], "DiskPressure", "True")
    condition(w, w.names[1], "InPlaceUpdate", "True", reason="ReadyForUpdate")
    assert w.target.parts.nodes.accept == METADATA_ONLY
    await w.run(12)
    # FakeKube ignores the accept header: the view carries the conditions, the rules must not use them.
    assert w.target.snapshot()["skipped"] == {}
    assert World(1).target.parts.nodes.accept is None  # on by default: full Node objects


# -- the verdict and the estimate


async def test_nodes_whose_machines_failed_do_not_count_towards_a_scale_down() -> None:
    """Three machines Failed and their nodes silent, three more nodes silent: 3 of 7 candidates
    are stale (43 %), no scale-down, as DWD decides. Counted, 6 of 10 (60 %) would scale down
    the MCM that is to replace them."""
    w = World(10)
    for name in w.names[:3]:
        machine(w, name, "Failed")
    await w.run(12)
    w.alive -= set(w.names[:6])
    await w.run(30)
    assert not w.ever_scaled_down(), w.target.status.reason
    assert (w.target.status.candidates, w.target.status.stale) == (7, 3)


def test_the_estimate_weighs_a_zone_by_the_nodes_no_rule_left_out() -> None:
    """Zone a: 280 nodes, 279 of them on their way out (a Machine Failed, an in-place update, an
    unhealthy condition); zone b: 120. a's one candidate stopping is one node in 121."""

    def view(i: int) -> NodeView:
        if i % 3 == 1:
            return NodeView(f"a{i}", zone="a", in_place_update=True)
        if i % 3 == 2:
            return NodeView(f"a{i}", zone="a", true_conditions=frozenset({"NetworkUnavailable"}))
        return NodeView(f"a{i}", zone="a")

    nodes = {f"a{i}": NodeObs(view(i), 0.0) for i in range(280)}
    nodes |= {f"b{i}": NodeObs(NodeView(f"b{i}", zone="b"), 0.0) for i in range(120)}
    machines = {f"a{i}": "Failed" for i in range(3, 280, 3)}
    leases = {
        name: LeaseObs(LeaseView(name, renew_time="t", interval_s=2.0), NOW - (9.0 if name == "a0" else 1.0))
        for name in nodes
    }
    sample = {"a0", *(f"b{i}" for i in range(20))}
    p = DeciderSettings()
    v = decide(Look(nodes, leases, NOW, p, Memory(Phase.HEALTHY, 0.0), 0.0, sample=sample, machines=machines))
    assert v.estimate == pytest.approx(1 / 121)
    assert v.memory.phase is Phase.HEALTHY
    assert len(skipped(nodes, leases, NOW, p, machines)) == 279


# -- the Machines: fresh before a scale-down, and an unreadable seed


async def test_the_interlock_reads_the_machines_afresh_before_a_scale_down() -> None:
    """Six of ten agents silent; before the scale-down MCM declares three of those machines
    Failed. Read only by the interlock (the cadences set far out), that read refuses."""
    w = World(10, machines_every_s=1000.0, machines_idle_s=1000.0)
    await w.run(12)
    w.alive -= set(w.names[:6])
    for name in w.names[:3]:
        machine(w, name, "Failed")
    await w.run(20)
    assert not w.ever_scaled_down()
    assert w.target.metrics.blocked.get(target="shoot", reason=Interlock.LIST_DISAGREES) == 1
    assert (w.target.status.candidates, w.target.status.stale) == (7, 3)


async def test_a_seed_without_machines_turns_the_rule_off_and_says_so() -> None:
    w = World(10)  # the fake seed serves no machines: 404
    await w.settle()
    assert w.target.snapshot()["machines"]["rule"] == ABSENT
    await w.outage()


async def test_machines_that_cannot_be_read_neither_leave_nodes_out_nor_block_a_scale_down() -> None:
    w = World(10)
    w.seed.fail("GET", "/machines", forbidden)
    await w.settle()  # every node counted
    snap = w.target.snapshot()
    assert "403" in snap["machines"]["error"] and snap["machines"]["age_s"] is None
    await w.outage()


async def test_a_failed_read_keeps_the_last_reads_verdict_for_a_while_then_drops_it() -> None:
    w = World(4, machines_every_s=2.0, machines_idle_s=2.0, machines_keep_s=20.0)
    machine(w, w.names[0], "Failed")
    await w.run(12)
    assert w.target.snapshot()["skipped"] == {w.names[0]: "machine Failed"}
    w.seed.fail("GET", "/machines")
    await w.run(15)
    snap = w.target.snapshot()
    assert snap["skipped"] == {w.names[0]: "machine Failed"}
    assert "LIST machines: 500" in snap["machines"]["error"]
    assert snap["machines"]["rule"] == "on, from the last good read"
    await w.until(lambda: not w.target.snapshot()["skipped"], 10, "the old read dropped")
    assert 20.0 < w.clock() - w.target.parts.evidence.machines.ok_at <= 21.0
    assert w.target.snapshot()["machines"]["rule"].startswith("off until a read succeeds")
    assert w.target.status.candidates == 4


async def test_the_machines_are_read_in_pages() -> None:
    w = World(1)
    for i in range(1200):
        machine(w, f"n{i}", "Failed" if i % 2 else "Running")
    pages: list[str] = []
    w.seed.on_request = lambda method, path: pages.append(path) if path.endswith("/machines") else None
    assert await w.target.parts.evidence.machines.read()
    assert len(pages) == 3
    phases = w.target.parts.evidence.machines.phases()
    assert len(phases) == 1200 and phases["n1199"] == "Failed" and phases["n0"] == "Running"


async def test_a_seed_that_does_not_answer_delays_a_tick_by_the_machines_timeout_at_most() -> None:
    w = World(10, machines_timeout_s=0.05)
    w.seed.hang = Rule("GET", "/machines$", server_error)
    await w.settle()  # the ticks went on, every node counted
    assert "no answer within 0.05s" in w.target.snapshot()["machines"]["error"]
    await w.outage()


def test_a_node_with_several_machines_is_kept_when_one_of_them_is_not_leaving() -> None:
    def m(node: str | None, phase: str | None) -> dict[str, Any]:
        labels = {} if node is None else {"node": node}
        status = {} if phase is None else {"currentStatus": {"phase": phase}}
        return {"metadata": {"labels": labels}, "status": status}

    items = [
        *(m("a", "Terminating"), m("a", "Running")),
        *(m("d", "Running"), m("d", "Failed")),  # in either order
        *(m("b", "Failed"), m("c", None), m(None, "Failed")),
    ]
    assert phases_by_node(items) == {"a": "Running", "d": "Running", "b": "Failed", "c": ""}


# -- reading nodes and Clusters


def test_a_node_view_carries_its_pool_its_true_conditions_and_an_in_place_update() -> None:
    def node(*conditions: dict[str, str]) -> NodeView:
        meta = {"name": "n", "labels": {"worker.gardener.cloud/pool": "p1"}}
        return NodeView.from_object({"metadata": meta, "status": {"conditions": list(conditions)}})

    v = node({"type": "DiskPressure", "status": "True"}, {"type": "Ready", "status": "False"})
    assert (v.pool, v.true_conditions, v.in_place_update) == ("p1", frozenset({"DiskPressure"}), False)
    assert node({"type": "InPlaceUpdate", "status": "True", "reason": "UpdateFailed"}).in_place_update
    assert not node(
        {"type": "InPlaceUpdate", "status": "True", "reason": "SelectedForUpdate"}
    ).in_place_update


async def test_full_nodes_are_listed_in_pages_into_one_view() -> None:
    w = World(5)
    w.target.parts.nodes.page_size = 2
    pages: list[str] = []
    w.shoot.on_request = lambda method, path: pages.append(path) if path == "/api/v1/nodes" else None
    await w.target.parts.nodes.list_now()
    assert len(pages) == 3 and sorted(w.target.parts.observed.nodes) == w.names
    assert World(1).target.parts.nodes.page_size == 500
    assert World(1, node_conditions=None).target.parts.nodes.page_size is None  # metadata: one LIST


def test_a_status_update_of_a_node_does_not_wake_the_provisioner() -> None:
    observed = Observed(clock=lambda: NOW)
    observed.node_event("ADDED", NodeView("n", uid="u1"))
    assert observed.changed.is_set()
    observed.changed.clear()
    observed.node_event("MODIFIED", NodeView("n", uid="u1", true_conditions=frozenset({"DiskPressure"})))
    assert not observed.changed.is_set()
    assert observed.nodes["n"].view.true_conditions == {"DiskPressure"}
    observed.node_event("MODIFIED", NodeView("n", uid="u2"))  # a new node of the same name
    assert observed.changed.is_set()


def test_a_shoots_pools_are_read_from_its_cluster_as_dependency_watchdog_reads_them() -> None:
    workers = [
        {"name": "a", "machineControllerManager": {"nodeConditions": ["X", "Y"]}},
        {"name": "b", "machineControllerManager": {"nodeConditions": []}},  # empty: the default
        {"name": "c", "machineControllerManager": {"machineDrainTimeout": "10m"}},
        {"name": "d"},  # no settings: not named, the default applies
    ]
    assert pools_of_workers(workers) == {"a": ("X", "Y"), "b": DEFAULT_CONDITIONS, "c": DEFAULT_CONDITIONS}


async def test_a_clusters_pools_reach_the_target_over_the_setting() -> None:
    seed = FakeKube()
    seed.put(
        "/apis/extensions.gardener.cloud/v1alpha1/clusters/shoot--p--a",
        cluster("shoot--p--a", workers=2, node_conditions={"pool-1": ["GPUUnhealthy"]}),
    )
    source = GardenerSource(seed, "access")
    watching = asyncio.create_task(source.run())
    try:
        spec = (await source.desired())["shoot--p--a"]
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    assert spec.node_conditions == (("pool-1", ("GPUUnhealthy",)),)
    settings = Settings(
        decider=DeciderSettings(node_conditions=NodeConditions.parse("pool-1: [A]\ncpu: [B]"))
    )
    t = Target(
        "t",
        NS,
        FakeKube(),
        Shared(settings, seed, ()),
        scope=Scope(),
        node_conditions=dict(spec.node_conditions),
    )
    conditions = t.params.node_conditions
    assert conditions is not None
    assert (conditions.for_pool("pool-1"), conditions.for_pool("cpu"), conditions.for_pool("x")) == (
        ("GPUUnhealthy",),
        ("B",),
        DEFAULT_CONDITIONS,
    )
    assert ClusterView.from_object({"metadata": {"name": "c"}}).node_conditions == ()


# -- the setting


def settings(kubeconfig: Path, value: str) -> Settings:
    return Settings.from_env(
        {"DWD_SHOOT_KUBECONFIG": str(kubeconfig), "DWD_NAMESPACE": NS, "DWD_NODE_CONDITIONS": value}
    )


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    p = tmp_path / "kubeconfig"
    p.write_text("apiVersion: v1\nkind: Config\n")
    return p


def test_the_setting_takes_dependency_watchdogs_per_pool_shape(kubeconfig: Path) -> None:
    assert settings(kubeconfig, "").decider.node_conditions == NodeConditions()
    assert settings(kubeconfig, "off").decider.node_conditions is None
    c = settings(kubeconfig, '{"gpu": ["GPUUnhealthy", "DiskPressure"], "*": ["KernelDeadlock"], "x": []}')
    assert c.decider.node_conditions is not None
    assert c.decider.node_conditions.for_pool("gpu") == ("GPUUnhealthy", "DiskPressure")
    assert c.decider.node_conditions.for_pool("other") == ("KernelDeadlock",)
    assert c.decider.node_conditions.for_pool("x") == ()  # that pool's nodes: never for a condition


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[DiskPressure]", "expected a mapping of worker pool to a list of condition types"),
        ("gpu: DiskPressure", "pool 'gpu': expected a list of condition types"),
        ("gpu: [1]", "pool 'gpu': expected a list of condition types"),
        ("gpu: ['']", "pool 'gpu': expected a list of condition types"),
        ("{gpu: [A]", "not YAML"),
        ("1: [A]", "1 is not a worker pool name"),
        ("on", "expected a mapping"),
    ],
)
def test_a_bad_setting_is_named_with_what_is_wrong(kubeconfig: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        Settings.from_env(
            {
                "DWD_SHOOT_KUBECONFIG": str(kubeconfig),
                "DWD_NAMESPACE": NS,
                "DWD_NODE_CONDITIONS": value,
                "DWD_MIN_CANDIDATES": "0",  # reported with it, in the same error
            }
        )
    problems = [p for p in e.value.problems if p.startswith("DWD_NODE_CONDITIONS:")]
    assert len(problems) == 1 and message in problems[0], e.value.problems
    assert any(p.startswith("DWD_MIN_CANDIDATES:") for p in e.value.problems)


async def test_a_rule_that_leaves_nodes_out_is_logged_once_per_rule_when_it_starts_and_ends() -> None:
    """dependency-watchdog logs which rule filtered each node; here one line per rule and
    change (a pool of 500 nodes with DiskPressure is one line, not 500 every tick)."""
    from structlog.testing import capture_logs

    w = World(6)
    n = w.names
    condition(w, n[0], "DiskPressure", "True")
    condition(w, n[1], "DiskPressure", "True")
    condition(w, n[2], "KernelDeadlock", "True")
    with capture_logs() as logs:
        await w.run(12)
        node = w.shoot.objects[f"/api/v1/nodes/{n[2]}"]
        w.shoot.put(f"/api/v1/nodes/{n[2]}", {**node, "status": {"conditions": []}})
        await w.run(3)
    told = [
        (e["event"], e["rule"], e["nodes"], e["first"])
        for e in logs
        if e["event"].startswith("nodes_left_out")
    ]
    assert told == [
        ("nodes_left_out", "an unhealthy condition (DiskPressure)", 2, [n[0], n[1]]),
        ("nodes_left_out", "an unhealthy condition (KernelDeadlock)", 1, [n[2]]),
        ("nodes_left_out_over", "an unhealthy condition (KernelDeadlock)", 1, [n[2]]),
    ]
