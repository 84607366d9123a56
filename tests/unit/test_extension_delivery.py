"""The shoot part as the extension delivers it (aggregator/extension/delivery.py and the
reconciler's steps that write it) against the fake seed: delivered on reconcile and restore,
taken away for an owner's opt-out and a hibernated shoot, gone before the finalizer on delete,
left in the shoot on migrate; the objects file refused, naming it, when it is not what it must be.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.extension import monitoring
from aggregator.extension.contract import FINALIZER, OPERATION, ExtensionView
from aggregator.extension.delivery import (
    MANAGED_RESOURCE,
    NO_CLEANUP,
    OBJECTS_KEY,
    OBJECTS_SECRET,
    ORIGIN,
    ShootPart,
    managed_resource_path,
    secret_path,
)
from aggregator.extension.source import ExtensionSource
from aggregator.model.lifecycle import ClusterView
from aggregator.observe.sources import CLUSTERS
from core.errors import ConfigError, NotFound
from testenv.gardener.seed_objects import DELETED_AT, cluster
from tests.unit.fakekube import FakeKube
from tests.unit.test_extension import PATH, SETTINGS, good, listed, reconciler, status, status_writes, world
from tests.unit.world import NS

ROOT = Path(__file__).resolve().parents[2]
OBJECTS = ROOT / "manifests" / "gardener" / "shoot" / "objects.yaml"
ACCESS = "shoot-access-dwd-lease-aggregator"
MR = managed_resource_path(NS)
SECRETS = (secret_path(NS, OBJECTS_SECRET), secret_path(NS, ACCESS))
IMAGE = "registry.example/dwd-lease:1.2.3"


def part() -> ShootPart:
    return ShootPart.load(str(OBJECTS), ACCESS, IMAGE)


async def passes(kube: FakeKube, n: int = 1, **kw: Any) -> ExtensionSource:
    source = ExtensionSource(kube, SETTINGS)
    for _ in range(n):
        await listed(source)
        await reconciler(kube, source, part=part(), **kw).reconcile_all()
    return source


def delivered(kube: FakeKube) -> set[str]:
    return {p for p in (MR, *SECRETS) if p in kube.objects}


def annotate(kube: FakeKube, operation: str) -> None:
    kube.objects[PATH]["metadata"].setdefault("annotations", {})[OPERATION] = operation


async def test_a_reconcile_delivers_the_shoot_part_as_gardener_has_an_extension_deliver_it() -> None:
    kube = world()
    await passes(kube)
    mr = kube.objects[MR]
    assert mr["metadata"]["labels"] == {"origin": ORIGIN}
    assert mr["spec"] == {
        "secretRefs": [{"name": OBJECTS_SECRET}],
        "injectLabels": {NO_CLEANUP: "true"},
        "keepObjects": False,
    }
    data = kube.objects[SECRETS[0]]["data"][OBJECTS_KEY]
    docs = list(yaml.safe_load_all(base64.b64decode(data)))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        (d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(OBJECTS.read_text()) if d
    ]
    (agent,) = (d for d in docs if d["kind"] == "DaemonSet")
    assert {c["image"] for c in agent["spec"]["template"]["spec"]["containers"]} == {IMAGE}
    access = kube.objects[SECRETS[1]]["metadata"]
    assert access["labels"]["resources.gardener.cloud/purpose"] == "token-requestor"
    assert status_writes(kube)[-1] == ("Create", "Succeeded")
    # Asked again (gardenlet's next shoot reconcile): written over, not refused as existing.
    annotate(kube, "reconcile")
    await passes(kube)
    assert status_writes(kube)[-1] == ("Reconcile", "Succeeded") and delivered(kube) == {MR, *SECRETS}


async def test_an_owners_opt_out_takes_the_shoot_part_away_and_a_hibernated_shoot_gets_none() -> None:
    kube = world()
    await passes(kube)
    kube.objects[PATH]["spec"]["providerConfig"] = good(disabled=True)
    annotate(kube, "reconcile")
    await passes(kube)
    # The resource manager deletes what the ManagedResource delivered first: Processing meanwhile.
    assert status(kube)["lastOperation"]["state"] == "Processing" and MR not in kube.objects
    await passes(kube)
    assert delivered(kube) == set() and status_writes(kube)[-1] == ("Reconcile", "Succeeded")

    kube = world(hibernation=True, hibernated=True)
    await passes(kube, 2)
    assert delivered(kube) == set() and status_writes(kube)[-1] == ("Create", "Succeeded")


async def test_a_failed_delivery_is_a_last_error_that_says_so() -> None:
    kube = world()
    kube.fail("POST", "managedresources$")
    await passes(kube)
    got = status(kube)
    assert got["lastOperation"]["state"] == "Error"
    assert got["lastError"]["description"].startswith("delivering the shoot part: ")


async def test_a_deletion_takes_the_shoot_part_away_before_the_finalizer() -> None:
    kube = world()
    await passes(kube)
    kube.objects[PATH]["metadata"]["deletionTimestamp"] = DELETED_AT
    await passes(kube)
    assert PATH in kube.objects and MR not in kube.objects  # the ManagedResource first
    await passes(kube)
    assert PATH not in kube.objects and delivered(kube) == set()


async def test_a_deletion_waits_for_the_resource_manager_and_a_force_deletion_does_not() -> None:
    kube = world()
    await passes(kube)
    kube.objects[MR]["metadata"]["finalizers"] = ["resources.gardener.cloud/gardener-resource-manager"]
    kube.objects[PATH]["metadata"]["deletionTimestamp"] = DELETED_AT
    await passes(kube, 3)
    # The shoot beyond reach: the resource manager never lets the ManagedResource go.
    assert PATH in kube.objects and status_writes(kube)[-1] == ("Delete", "Processing")
    assert delivered(kube) == {MR, *SECRETS}

    # The Shoot confirmed for force deletion: nothing of the shoot's is waited on.
    deleting = cluster(NS, deleting=True, force_deletion="true")
    kube.put(f"{CLUSTERS}/{NS}", deleting)
    await passes(kube)
    assert PATH not in kube.objects  # Delete Succeeded, then the finalizer gone
    assert delivered(kube) == {MR}  # its Secrets gone; gardenlet finalizes what it left
    assert kube.objects[MR]["metadata"].get("deletionTimestamp")
    assert status_writes(kube)[-1] == ("Delete", "Succeeded")


async def test_a_stale_view_of_a_finished_migration_does_not_run_it_again() -> None:
    """The informer's cache may hold the Extension as the Succeeded status write left it (the
    migrate annotation still on) after the release that followed: not migrated again, so no
    Processing over its Succeeded for gardenlet to read."""
    kube = world()
    source = ExtensionSource(kube, SETTINGS)
    controller = reconciler(kube, source, part=part())
    await listed(source)
    await controller.reconcile_all()
    kube.put(f"{CLUSTERS}/{NS}", cluster(NS, last_operation=("Migrate", "Processing")))
    annotate(kube, "migrate")
    answers: list[dict[str, Any]] = []
    patch = kube.merge_patch

    async def recorded(path: str, body: Any) -> dict[str, Any]:
        answers.append(copy.deepcopy(await patch(path, body)))
        return answers[-1]

    kube.merge_patch = recorded  # type: ignore[method-assign]
    for _ in range(2):
        await listed(source)
        await controller.reconcile_all()
    assert status_writes(kube)[-1] == ("Migrate", "Succeeded")
    (stale,) = (
        a
        for a in answers
        if (a.get("status") or {}).get("lastOperation", {}).get("state") == "Succeeded"
        and OPERATION in (a["metadata"].get("annotations") or {})
    )
    writes = len(kube.writes)
    await controller.reconcile(ExtensionView.from_object(stale))
    assert len(kube.writes) == writes


@pytest.mark.parametrize(
    ("value", "force"),
    [("true", True), ("True", True), ("1", True), ("t", True), ("yes", False), ("", False), (None, False)],
)
def test_force_deletion_is_read_as_gardeners_parse_bool(value: str | None, force: bool) -> None:
    assert ClusterView.from_object(cluster(NS, force_deletion=value)).force_deletion is force


async def test_a_migration_leaves_the_objects_in_the_shoot_and_a_restore_takes_them_over() -> None:
    kube = world()
    await passes(kube)
    # gardenlet's migration: the Cluster says Migrate, then the Extension is annotated.
    kube.put(f"{CLUSTERS}/{NS}", cluster(NS, last_operation=("Migrate", "Processing")))
    kube.objects[PATH]["metadata"]["finalizers"].append("someone-else")
    annotate(kube, "migrate")
    await passes(kube, 2)
    patches = [b for m, p, b in kube.writes if m == "PATCH" and p == MR]
    assert patches == [{"spec": {"keepObjects": True}}]  # before the deletion: the objects stay
    assert delivered(kube) == set()
    meta = kube.objects[PATH]["metadata"]
    assert meta["finalizers"] == [] and OPERATION not in meta["annotations"]
    assert status_writes(kube)[-1] == ("Migrate", "Succeeded")
    # Until the restore, nothing of ours: not delivered again, and its deletion not waited on.
    writes = len(kube.writes)
    await passes(kube)
    assert len(kube.writes) == writes

    # The next seed's controller, restoring (its Cluster says Restore).
    kube.put(f"{CLUSTERS}/{NS}", cluster(NS, last_operation=("Restore", "Processing")))
    annotate(kube, "restore")
    await passes(kube)
    assert delivered(kube) == {MR, *SECRETS}
    assert kube.objects[PATH]["metadata"]["finalizers"] == [FINALIZER]
    assert status_writes(kube)[-2:] == [("Restore", "Processing"), ("Restore", "Succeeded")]
    # Answered: a restore is a reconcile, in the new seed; nothing more until gardenlet asks.
    writes = len(kube.writes)
    await passes(kube)
    assert len(kube.writes) == writes


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("- not a mapping\n", "document 0 is not a Kubernetes object"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "document 0 (ConfigMap) has no metadata.name"),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            "0 DaemonSets named dwd-lease-agent, not one",
        ),
        ("a: [\n", "while parsing"),
    ],
)
def test_an_objects_file_that_is_not_the_shoot_part_is_refused_naming_it(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        ShootPart.load(str(path), ACCESS)
    (message,) = e.value.problems
    assert message.startswith(f"DWD_SHOOT_OBJECTS {path}: ") and problem in message


def test_without_an_image_the_objects_keep_theirs() -> None:
    docs = list(yaml.safe_load_all(ShootPart.load(str(OBJECTS), ACCESS).objects))
    assert docs == [d for d in yaml.safe_load_all(OBJECTS.read_text()) if d]
    assert MANAGED_RESOURCE == "dwd-lease-shoot"


MONITORING = monitoring.paths(NS)


async def test_the_shoots_own_alerts_go_with_the_shoot_part_and_away_with_it() -> None:
    """With the controller's namespace known, each reconcile delivers the ServiceMonitor and the
    PrometheusRule the shoot's Prometheus takes (prometheus: shoot, in the shoot's namespace), the
    monitor on the aggregator's Service in the controller's namespace and this shoot's series
    only; a hibernation keeps them, an opt-out takes them away with the shoot part."""
    kube = world()
    await passes(kube, heartbeat_ns="extension-dwd-lease")
    monitor, rule = (kube.objects[p] for p in MONITORING)
    assert monitor["metadata"]["labels"] == rule["metadata"]["labels"] == {"prometheus": "shoot"}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["extension-dwd-lease"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert {"sourceLabels": ["target"], "action": "keep", "regex": f"^{NS}$"} in endpoint["metricRelabelings"]
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts == ["DwdLeaseControllersHeldDown", "DwdLeaseCannotJudge"]
    kube.objects[PATH]["spec"]["providerConfig"] = good(disabled=True)
    annotate(kube, "reconcile")
    await passes(kube, 2, heartbeat_ns="extension-dwd-lease")
    assert not any(p in kube.objects for p in MONITORING) and delivered(kube) == set()


async def test_a_seed_without_prometheus_operators_crds_gets_its_shoot_part_all_the_same() -> None:
    kube = world()
    for kind in ("servicemonitors", "prometheusrules"):
        kube.fail(
            "POST", f"{kind}$", lambda: NotFound(404, "NotFound", "the server could not find the resource")
        )
    await passes(kube, heartbeat_ns="extension-dwd-lease")
    assert status_writes(kube)[-1] == ("Create", "Succeeded") and delivered(kube) == {MR, *SECRETS}
