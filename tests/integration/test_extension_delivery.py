"""The extension delivering the shoot part the Gardener way, against real API servers and the real
gardener-resource-manager (testenv/gardener/grm.py), one per seed as gardenlet runs a shoot's: two seeds'
kube-apiservers and one shoot's. A 1-node shoot turned on after the controller started gets its agents'
DaemonSet from one reconcile, and too small to judge, its Shoot's condition untouched; one whose
owner set ``disabled`` gets nothing; the shoot's control plane migrated from the first seed to
the second keeps its agents (the same DaemonSet, never deleted) and its controllers' replicas,
leaves nothing of ours in the first seed, and is left alone in the second while it waits for its
state; a hibernation with the shoot's API server gone is answered at once, its shoot part kept.

Every Extension read back is decoded strictly by Gardener's types and judged by gardenlet's own
function (health.CheckExtensionObject).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from aggregator.extension import monitoring
from aggregator.extension.contract import OPERATION
from aggregator.extension.delivery import MANAGED_RESOURCES, OBJECTS_SECRET, managed_resource_path
from aggregator.model.protection import API_VERSION, KIND
from aggregator.model.records import MELTDOWN, RECORD, REPLICAS
from aggregator.observe.sources import CLUSTERS
from core.errors import Invalid, NotFound, TooManyRequests
from testenv.base.kapi import Client, node_leases
from testenv.base.process import Process
from testenv.base.wait import wait_for
from testenv.gardener import grm
from testenv.gardener.apply import RESOURCES, apply
from testenv.gardener.gardener_types import extension_verdicts, shoot_conditions, strict_errors
from testenv.gardener.seed_objects import TIMESTAMP, cluster, extension, module_crds
from testenv.kube.controllers import CONTROLLERS, DOWN, KCM
from testenv.kube.controlplane import ControlPlane, ensure_node, free_port
from testenv.worlds.agents import Agents
from testenv.worlds.shoot_world import Shoot
from tests.integration.test_service import up

pytestmark = [pytest.mark.integration, pytest.mark.builds(grm.NAME)]

ROOT = Path(__file__).resolve().parents[2]
OBJECTS = ROOT / "manifests" / "gardener" / "shoot" / "objects.yaml"
NS = "shoot--ext--s"
OFF = "shoot--ext--off"  # its owner set disabled
ACCESS = "shoot-access-dwd-lease-aggregator"
AGENTS = "/apis/apps/v1/namespaces/kube-system/daemonsets/dwd-lease-agent"
# The controller's heartbeat, in the namespace it is told to beat in (DWD_LEADER_ELECTION_NAMESPACE).
HEARTBEAT_LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/gardener-extension-heartbeat"


@dataclass
class Seed:
    """One seed: its API server as the shoot's namespace sees it, its resource manager for the
    shoot, and the extension controller running there."""

    shoot: Shoot
    grm: grm.ResourceManager
    controller: Process | None = None

    @property
    def admin(self) -> Client:
        return self.shoot.seed_admin


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Seed, Seed]]:
    tmp = tmp_path_factory.mktemp("extension-delivery")
    for kind, plural in (
        ("Cluster", "clusters"),
        ("Extension", "extensions"),
        ("ManagedResource", "managedresources"),
        ("PrometheusRule", "prometheusrules"),
        ("ServiceMonitor", "servicemonitors"),
    ):
        RESOURCES.setdefault(kind, (plural, kind != "Cluster"))
    with contextlib.ExitStack() as stack:
        shoot = stack.enter_context(
            ControlPlane(extra_apiserver_args=["--api-audiences=kubernetes,gardener"]).running()
        )
        pair = []
        for name in ("a", "b"):
            seed = stack.enter_context(ControlPlane().running())
            world = Shoot(shoot, seed, NS, tmp / name)
            stack.callback(world.close)
            world.setup(nodes=0)
            apply(
                world.seed_admin,
                module_crds("Cluster", "Extension", "ManagedResource", "PrometheusRule", "ServiceMonitor"),
            )
            wait_for(partial(_established, world.seed_admin), 30, "the CRDs")
            manager = grm.ResourceManager(
                seed, shoot, NS, workdir=tmp / name / "grm", kubernetes_service_host="localhost"
            )
            stack.enter_context(manager.running())
            pair.append(Seed(world, manager))
        yield pair[0], pair[1]


def start(seed: Seed) -> Process:
    port = free_port()
    seed.controller = seed.shoot.start_aggregator(
        {
            "DWD_SHOOT_KUBECONFIG": "",
            "DWD_NAMESPACE": "",
            "DWD_TARGETS": "extension",
            "DWD_SHOOT_OBJECTS": str(OBJECTS),
            "DWD_SHOOT_SERVER": seed.shoot.shoot.url,
            "DWD_METRICS_ADDR": f"127.0.0.1:{port}",
            # Where its heartbeat goes (the chart: its own namespace).
            "DWD_LEADER_ELECTION_NAMESPACE": NS,
        }
    )
    wait_for(lambda: up(port), 30, f"the extension controller ready (log: {seed.controller.log_path})")
    return seed.controller


def verdict(admin: Client, namespace: str) -> tuple[str, str, str]:
    """The Extension's last operation (type, state) and gardenlet's verdict on it ("" = ready),
    the object checked by Gardener's types; printed for the record."""
    obj = admin.get(_extension_path(namespace))
    assert strict_errors([obj]) == [""], json.dumps(obj)
    (said,) = extension_verdicts([obj])
    last = (obj.get("status") or {}).get("lastOperation") or {}
    return str(last.get("type")), str(last.get("state")), said


def answered(admin: Client, namespace: str, kind: str) -> bool:
    obj = admin.get(_extension_path(namespace))
    last = (obj.get("status") or {}).get("lastOperation") or {}
    pending = OPERATION in (obj["metadata"].get("annotations") or {})
    return not pending and (last.get("type"), last.get("state")) == (kind, "Succeeded")


def ours_in(admin: Client, namespace: str) -> list[str]:
    """What of ours a seed namespace holds: the ManagedResource, its Secrets, the shoot's own
    alerts, records."""
    ours = (managed_resource_path(namespace), *_secrets(namespace), *monitoring.paths(namespace))
    left = [p for p in ours if _exists(admin, p)]
    for d in admin.get(f"/apis/apps/v1/namespaces/{namespace}/deployments")["items"]:
        if {RECORD, REPLICAS, MELTDOWN} & set(d["metadata"].get("annotations") or {}):
            left.append(f"record on {d['metadata']['name']}")
    return left


def test_a_new_shoot_gets_its_agents_from_one_reconcile_and_an_opted_out_one_none(
    seeds: tuple[Seed, Seed],
) -> None:
    a, _ = seeds
    ensure_node(a.shoot.shoot_admin, "node-0")  # a 1-node shoot
    start(a)
    apply(a.admin, [cluster(NS), extension(NS)])
    t0 = time.monotonic()
    wait_for(lambda: answered(a.admin, NS, "Create"), 30, "the Extension answered")
    agents = wait_for(lambda: _get(a.shoot.shoot_admin, AGENTS), 60, "the agents' DaemonSet in the shoot")
    took = time.monotonic() - t0
    assert verdict(a.admin, NS) == ("Create", "Succeeded", "")
    writes = [n for n in a.controller.names() if n == "extension_reconciled"] if a.controller else []
    print(
        f"\nnew shoot {NS}: agents' DaemonSet in the shoot {took:.1f}s after its Extension, "
        f"{len(writes)} reconcile; gardenlet says ready"
    )
    assert len(writes) == 1
    assert agents["metadata"]["labels"].get("shoot.gardener.cloud/no-cleanup") == "true"
    # The shoot's own alerts beside the shoot part, for the shoot's Prometheus (prometheus: shoot).
    alerts = [a.admin.get(p) for p in monitoring.paths(NS)]
    assert strict_errors(alerts) == ["", ""] and {x["metadata"]["labels"]["prometheus"] for x in alerts} == {
        "shoot"
    }
    wait_for(partial(_applied, a.admin), 60, f"GRM applied (log: {a.grm.proc and a.grm.proc.log_path})")

    # The owner's opt-out: answered and ready, and nothing delivered.
    a.admin.create("/api/v1/namespaces", {"metadata": {"name": OFF}})
    off = {"apiVersion": API_VERSION, "kind": KIND, "disabled": True}
    apply(a.admin, [cluster(OFF), extension(OFF, provider_config=off)])
    wait_for(lambda: answered(a.admin, OFF, "Create"), 30, "the opted-out Extension answered")
    assert verdict(a.admin, OFF) == ("Create", "Succeeded", "")
    assert ours_in(a.admin, OFF) == []
    print(f"opted-out shoot {OFF}: ready, nothing delivered")

    # One node, no agent renewing (no kubelet runs the DaemonSet here): too few to judge, which
    # is no broken protection. The Shoot's condition is left to gardenlet's other checks.
    assert a.controller is not None
    condition, shoots = _reason(a.admin, "QuorumNotJudged", 30, a.controller)
    print(f"{NS}: {condition['type']}={condition['status']} {condition['reason']}: {condition['message']}")
    print(f"  gardenlet's shoot care: {shoots or 'the Shoot condition left to its other checks'}")
    beat = a.admin.get(HEARTBEAT_LEASE)
    assert beat["spec"]["holderIdentity"] == "dwd-lease" and beat["spec"]["renewTime"]
    assert shoots == ""


def test_a_migration_keeps_the_agents_and_the_replicas_and_leaves_nothing_behind(
    seeds: tuple[Seed, Seed],
) -> None:
    a, b = seeds
    if a.controller is None:
        pytest.fail("needs the shoot turned on by the test before it (module order)")
    uid = a.shoot.shoot_admin.get(AGENTS)["metadata"]["uid"]
    # gardenlet's migration in the first seed: the Cluster says Migrate, the Extension is
    # annotated, and once it has answered, deleted.
    a.admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, last_operation=("Migrate", "Processing")))
    a.admin.merge_patch(_extension_path(NS), {"metadata": {"annotations": {OPERATION: "migrate"}}})
    wait_for(
        lambda: answered(a.admin, NS, "Migrate"), 60, f"the migration answered (log: {a.controller.log_path})"
    )
    kind, state, said = verdict(a.admin, NS)
    print(f"\nmigrate in seed a: {kind} {state}, gardenlet says {said or 'ready'}")
    assert (kind, state, said) == ("Migrate", "Succeeded", "")
    assert a.admin.get(_extension_path(NS))["metadata"].get("finalizers") in (None, [])
    a.admin.delete(_extension_path(NS))
    assert not _exists(a.admin, _extension_path(NS))
    assert ours_in(a.admin, NS) == []
    assert a.shoot.replicas() == CONTROLLERS

    # The second seed's gardenlet restores: the controllers deployed with their replicas, the
    # Cluster says Restore, the Extension created waiting for its state, then annotated restore.
    start(b)
    waiting = extension(NS)
    waiting["metadata"]["annotations"][OPERATION] = "wait-for-state"
    apply(b.admin, [cluster(NS, last_operation=("Restore", "Processing")), waiting])
    time.sleep(3)  # the controller's passes go by: it leaves the Extension alone
    left = b.admin.get(_extension_path(NS))
    assert not left.get("status") and not left["metadata"].get("finalizers"), left
    assert ours_in(b.admin, NS) == []
    print("wait-for-state in seed b: no finalizer, no status, nothing delivered")
    b.admin.merge_patch(_extension_path(NS), {"metadata": {"annotations": {OPERATION: "restore"}}})
    wait_for(lambda: answered(b.admin, NS, "Restore"), 30, "the restore answered")
    assert verdict(b.admin, NS) == ("Restore", "Succeeded", "")
    wait_for(partial(_applied, b.admin), 60, "the second seed's resource manager applied")
    agents = a.shoot.shoot_admin.get(AGENTS)
    assert agents["metadata"]["uid"] == uid  # taken over, never deleted
    assert b.shoot.replicas() == CONTROLLERS
    print(f"restore in seed b: ready; the agents' DaemonSet the same ({uid}); replicas {b.shoot.replicas()}")


def test_a_cut_is_told_on_the_extension_and_a_force_deletion_waits_on_nothing_in_the_shoot(
    seeds: tuple[Seed, Seed], tmp_path: Path
) -> None:
    """The restored shoot, the Gardener way on: its nodes' agents run (as the delivered
    DaemonSet's pods would: no container runtime here), renew the leases the controller made,
    and a cut of every agent is held down and restored, the Extension's condition saying so
    throughout. Then the shoot is deleted while its API server is gone: a deletion waits for the
    resource manager, which cannot clean the shoot; a force deletion waits on nothing."""
    _, b = seeds
    if b.controller is None:
        pytest.fail("needs the shoot restored by the test before it (module order)")
    cp, shoot_admin = b.shoot.shoot, b.shoot.shoot_admin
    # gardenlet's restore done: the shoot's control plane is the second seed's now.
    b.admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, last_operation=("Restore", "Succeeded")))
    _hibernated_and_woken(b)
    nodes = [f"node-{i}" for i in range(4)]
    for node in nodes:
        ensure_node(shoot_admin, node)
    wait_for(lambda: set(node_leases(shoot_admin)) >= set(nodes), 30, "the controller's leases for the nodes")
    agents = Agents(cp, tmp_path, shoot_admin)  # authorized by the delivered RBAC alone
    try:
        for node in nodes:
            agents.start(agents.env(node))
        said = [_reason(b.admin, "ProtectionActive", 60, b.controller)]
        for proc in agents.procs:  # the cut: no agent reaches the API server
            proc.kill()
        agents.procs.clear()
        wait_for(lambda: b.shoot.replicas() == DOWN, 30, "the controllers held down")
        said.append(_reason(b.admin, "ControllersHeldDown", 30, b.controller))
        assert verdict(b.admin, NS) == ("Reconcile", "Succeeded", "")  # the condition is no operation
        for node in nodes:  # healed
            agents.start(agents.env(node))
        wait_for(lambda: b.shoot.replicas() == CONTROLLERS, 30, "the controllers restored")
        said.append(_reason(b.admin, "ProtectionActive", 30, b.controller))
        said.append(_dry_run(b))
        _failed_shoot(b)
    finally:
        agents.close()
    for condition, shoots in said:
        print(f"{condition['type']}={condition['status']} {condition['reason']}: {condition['message']}")
        print(f"  gardenlet's shoot care: {shoots or 'the Shoot condition left to its other checks'}")
        assert shoots == ""

    cp.stop_apiserver()
    try:
        b.admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, deleting=True))
        b.admin.delete(_extension_path(NS))
        wait_for(lambda: _deleting(b.admin), 30, "the ManagedResource deleted")
        time.sleep(5)  # the resource manager cannot reach the shoot: nothing moves
        kind, state, judged = verdict(b.admin, NS)
        print(f"delete with the shoot's API server gone: {kind} {state}, gardenlet says {judged}")
        assert (kind, state) == ("Delete", "Processing") and judged and _deleting(b.admin)
        b.admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, deleting=True, force_deletion="true"))
        wait_for(lambda: not _exists(b.admin, _extension_path(NS)), 30, "the Extension gone")
        assert [p for p in _secrets(NS) if _exists(b.admin, p)] == []
        assert _deleting(b.admin)  # gardenlet's force deletion finalizes it
        assert b.shoot.replicas() == CONTROLLERS and ours_in(b.admin, NS) == [managed_resource_path(NS)]
        print("force-deleted: the Extension gone, its Secrets gone, the ManagedResource left to gardenlet")
    finally:
        cp.start_apiserver()


def _dry_run(seed: Seed) -> tuple[dict[str, Any], str]:
    """The owner turns the dry run on: True DryRun, the Extension ready; then off again."""
    said = _dry_run_set(seed, dry=True, reason="DryRun")
    _dry_run_set(seed, dry=False, reason="ProtectionActive")
    return said


def _ask(admin: Client, spec: dict[str, Any] | None = None) -> None:
    """A reconcile asked as gardenlet asks one: the operation annotation and its timestamp (with
    ``spec`` changed in the same write), answered once gardenlet's own check counts it ready.
    The timestamp tells an answer to this request from one to the last: a second apart, as
    lastUpdateTime counts seconds."""
    time.sleep(1)
    asked = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body: dict[str, Any] = {"metadata": {"annotations": {OPERATION: "reconcile", TIMESTAMP: asked}}}
    admin.merge_patch(_extension_path(NS), {**body, **({"spec": spec} if spec else {})})
    ready = ("Reconcile", "Succeeded", "")
    wait_for(lambda: verdict(admin, NS) == ready, 30, f"the reconcile asked at {asked} answered")


def _dry_run_set(seed: Seed, *, dry: bool, reason: str) -> tuple[dict[str, Any], str]:
    assert seed.controller is not None
    _ask(seed.admin, {"providerConfig": {"apiVersion": API_VERSION, "kind": KIND, "dryRun": dry}})
    return _reason(seed.admin, reason, 60, seed.controller)


def _failed_shoot(seed: Seed) -> None:
    """The shoot's last operation failed: its Extension is left alone, as every Gardener extension
    leaves it, until gardenlet's next attempt (the Cluster says Reconcile again)."""
    admin, path = seed.admin, _extension_path(NS)
    admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, last_operation=("Reconcile", "Failed")))
    time.sleep(1)  # the Cluster's watch event first: gardenlet writes the Cluster before it annotates
    before = admin.get(path)["status"]["lastOperation"]
    admin.merge_patch(path, {"metadata": {"annotations": {OPERATION: "reconcile"}}})
    time.sleep(3)  # the controller's passes go by
    kind, state, said = verdict(admin, NS)
    print(f"failed shoot: left alone ({kind} {state}), gardenlet says {said}")
    assert admin.get(path)["status"]["lastOperation"] == before and said.startswith("gardener operation")
    admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, last_operation=("Reconcile", "Processing")))
    _ask(admin)


def _hibernated_and_woken(seed: Seed) -> None:
    """gardenlet hibernates the shoot: its API server (and so its resource manager's reach) gone,
    the Cluster says hibernated, the Extension annotated. Answered at once, the shoot part kept,
    the condition True "Shoot is hibernated"; then woken and answered again."""
    cp, admin = seed.shoot.shoot, seed.admin
    assert seed.controller is not None
    cp.stop_apiserver()
    try:
        admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, hibernation=True, hibernated=True))
        t0 = time.monotonic()
        _ask(admin)
        took = time.monotonic() - t0 - 1  # _ask's second apart
        assert not _deleting(admin)
        _, shoots = _reason(admin, "ShootHibernated", 30, seed.controller)
        print(f"hibernated, the shoot's API server gone: answered in {took:.1f}s, the shoot part kept")
        assert shoots == "" and _exists(admin, managed_resource_path(NS))
    finally:
        cp.start_apiserver()
    admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, hibernation=False))
    _ask(admin)


def _reason(admin: Client, reason: str, timeout_s: float, controller: Process) -> tuple[dict[str, Any], str]:
    """Our condition once it says ``reason``, and what gardenlet's shoot care makes of it for the
    Shoot's (with the controller's heartbeat; "" where it leaves that to the other checks)."""

    def said() -> dict[str, Any] | None:
        condition = _condition(admin, NS, "True")
        return condition if condition is not None and condition["reason"] == reason else None

    condition = wait_for(said, timeout_s, f"SystemComponentsHealthy {reason} (log: {controller.log_path})")
    beat = admin.get(HEARTBEAT_LEASE)
    ((status, why, message),) = shoot_conditions([(admin.get(_extension_path(NS)), beat)])
    return dict(condition), " ".join(x for x in (status, why, message) if x)


def _deleting(admin: Client) -> bool:
    mr = _get(admin, managed_resource_path(NS)) or {}
    return bool((mr.get("metadata") or {}).get("deletionTimestamp"))


def _applied(admin: Client) -> bool:
    conditions = ((_get(admin, managed_resource_path(NS)) or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "ResourcesApplied" and c["status"] == "True" for c in conditions)


def _condition(admin: Client, namespace: str, status: str) -> dict[str, Any] | None:
    conditions = (admin.get(_extension_path(namespace)).get("status") or {}).get("conditions") or []
    return next(
        (c for c in conditions if c["type"] == "SystemComponentsHealthy" and c["status"] == status), None
    )


def _extension_path(namespace: str) -> str:
    return f"/apis/extensions.gardener.cloud/v1alpha1/namespaces/{namespace}/extensions/dwd-lease"


def _secrets(namespace: str) -> tuple[str, str]:
    return (
        f"/api/v1/namespaces/{namespace}/secrets/{OBJECTS_SECRET}",
        f"/api/v1/namespaces/{namespace}/secrets/{ACCESS}",
    )


def _get(admin: Client, path: str) -> dict[str, Any] | None:
    try:
        return admin.get(path)
    except NotFound:
        return None


def _exists(admin: Client, path: str) -> bool:
    return _get(admin, path) is not None


def _established(admin: Client) -> bool:
    try:
        admin.get(MANAGED_RESOURCES.format(ns=NS))
        admin.get(CLUSTERS)
        admin.get("/apis/extensions.gardener.cloud/v1alpha1/extensions")
    except (NotFound, TooManyRequests):  # 429: a new CRD's storage is still initialising
        return False
    return True


REFUSE = "refuse-deployment-writes"


def _refusing(namespace: str) -> list[dict[str, Any]]:
    """An admission policy that refuses every Deployment write in ``namespace``: a hand-back that
    cannot go through (a webhook down, a policy gone wrong), whoever sends it."""
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": REFUSE},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["deployments", "deployments/scale"],
                        }
                    ]
                },
                "validations": [{"expression": "false", "message": "refused by the test"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": REFUSE},
            "spec": {
                "policyName": REFUSE,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    ]


def _refused(admin: Client) -> bool:
    try:
        admin.merge_patch(
            f"/apis/apps/v1/namespaces/{NS}/deployments/{KCM}", {"metadata": {"labels": {"t": "1"}}}
        )
    except Invalid:
        return True
    return False


def test_a_force_deletion_lets_go_when_the_hand_back_is_refused(seeds: tuple[Seed, Seed]) -> None:
    """The first seed's copy of the shoot, held down by a record of ours, its Shoot confirmed for
    force deletion, every write to its controllers refused: the Extension's deletion lets go all
    the same (Gardener's ForceDelete "should still succeed, even if some resources are
    orphaned"), where a deletion without force would hold the finalizer and retry."""
    a, _ = seeds
    if a.controller is None:
        pytest.fail("needs the first seed's controller started by the tests before it (module order)")
    admin, path = a.admin, _extension_path(NS)
    record = json.dumps({"format": 2, "replicas": 3, "episode": "e-force"})
    admin.merge_patch(
        f"/apis/apps/v1/namespaces/{NS}/deployments/{KCM}",
        {"metadata": {"annotations": {RECORD: record, REPLICAS: "3", MELTDOWN: ""}}, "spec": {"replicas": 0}},
    )
    admin.merge_patch(f"{CLUSTERS}/{NS}", cluster(NS, deleting=True, force_deletion="true"))
    obj = extension(NS)
    obj["metadata"].update(finalizers=["extensions.gardener.cloud/dwd-lease"], annotations={})
    apply(admin, [obj])
    apply(admin, _refusing(NS))
    try:
        wait_for(lambda: _refused(admin), 30, "the admission policy in force")
        admin.delete(path)
        wait_for(lambda: not _exists(admin, path), 30, f"the Extension gone (log: {a.controller.log_path})")
        kcm = admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{KCM}")
        assert RECORD in kcm["metadata"]["annotations"]  # orphaned, as Gardener allows: the shoot goes whole
        assert "extension_force_deleted_orphaning" in a.controller.names()
        print("force deletion with every controller write refused: the Extension gone, our record orphaned")
    finally:
        for doc in reversed(_refusing(NS)):
            admin.delete(f"/apis/admissionregistration.k8s.io/v1/{RESOURCES[doc['kind']][0]}/{REFUSE}")
