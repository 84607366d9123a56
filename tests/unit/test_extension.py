"""The aggregator as Gardener's extension controller (aggregator/extension/) against the fake
seed: which shoots an Extension turns on, and the contract's writes on it (finalizer, operation
annotation, lastOperation, lastError, observedGeneration, the hand-back on deletion)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aggregator.extension.contract import (
    FINALIZER,
    OPERATION,
    ExtensionView,
    claim,
    operation_type,
    wants_reconcile,
)
from aggregator.extension.reconciler import Reconciler
from aggregator.extension.source import ExtensionSource
from aggregator.lead.scope import Scope
from aggregator.model.dependents import DEFAULT_DEPENDENTS
from aggregator.model.protection import API_VERSION, KIND
from aggregator.model.records import MELTDOWN, RECORD, REPLICAS
from aggregator.model.settings import Settings, ShootSettings
from aggregator.observe.sources import CLUSTERS
from testenv.gardener.seed_objects import DELETED_AT, cluster, extension, extension_status
from testenv.kube.controllers import CA, KCM, MCM
from tests.unit.fakekube import FakeKube
from tests.unit.test_scaler import seed
from tests.unit.world import NS, deployment_path

PATH = f"/apis/extensions.gardener.cloud/v1alpha1/namespaces/{NS}/extensions/dwd-lease"
SETTINGS = Settings(ShootSettings(mode="extension"))
NOW = "2026-01-01T00:00:05Z"


def good(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, **fields}


def world(provider_config: dict[str, Any] | None = None, **cluster_fields: Any) -> FakeKube:
    """A seed with the shoot's controllers, its Cluster and its Extension as gardenlet made it."""
    kube = seed()
    kube.put(f"{CLUSTERS}/{NS}", cluster(NS, **cluster_fields))
    obj = extension(NS, provider_config=provider_config)
    obj["metadata"]["generation"] = 1
    kube.put(PATH, obj)
    return kube


async def listed(source: ExtensionSource) -> None:
    for informer in (source.clusters.informer, source.informer):
        informer.synced.clear()
        await informer.list_now()
        informer.synced.set()


def reconciler(
    kube: FakeKube,
    source: ExtensionSource,
    served: set[str] | Callable[[], set[str]] | None = None,
    **kw: Any,
) -> Reconciler:
    return Reconciler(
        kube,
        source,
        SETTINGS,
        DEFAULT_DEPENDENTS,
        served=served if callable(served) else lambda: set() if served is None else served,
        wall=lambda: NOW,
        **kw,
    )


def status(kube: FakeKube) -> dict[str, Any]:
    return dict(kube.objects[PATH].get("status") or {})


def status_writes(kube: FakeKube) -> list[tuple[str, str]]:
    """(type, state) of every lastOperation written, in order."""
    return [
        (b["status"]["lastOperation"]["type"], b["status"]["lastOperation"]["state"])
        for m, p, b in kube.writes
        if m == "PATCH" and p == PATH + "/status"
    ]


async def test_an_extension_turns_its_shoot_on_with_its_own_settings_and_is_answered_ready() -> None:
    kube = world(good(failureFraction=0.8, dryRun=True))
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)
    desired = await source.desired()
    assert set(desired) == {NS}
    protection = desired[NS].protection
    assert protection is not None and protection.over(SETTINGS).decider.failure_fraction == 0.8
    assert protection.over(SETTINGS).scaling.dry_run is True
    await reconciler(kube, source).reconcile_all()
    meta = kube.objects[PATH]["metadata"]
    assert meta["finalizers"] == [FINALIZER] and OPERATION not in meta["annotations"]
    assert status_writes(kube) == [("Create", "Processing"), ("Create", "Succeeded")]
    got = status(kube)
    assert got["observedGeneration"] == 1 and got.get("lastError") is None
    assert got["lastOperation"]["lastUpdateTime"] == NOW
    # Answered: the next pass writes nothing.
    writes = len(kube.writes)
    await listed(source)
    await reconciler(kube, source).reconcile_all()
    assert len(kube.writes) == writes


async def test_a_bad_provider_config_is_a_last_error_naming_the_field_and_serves_nothing() -> None:
    kube = world(good(failureFraction=1.5, dryrun=True))
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)
    assert await source.desired() == {}
    assert source.unserved[NS].startswith("its providerConfig is invalid") and source.skipped == {}
    await reconciler(kube, source).reconcile_all()
    got = status(kube)
    assert got["lastOperation"]["state"] == "Error"
    assert got["lastError"]["description"] == (
        "providerConfig.dryrun: unknown field; "
        "providerConfig.failureFraction: 1.5 is not a fraction in (0, 1]"
    )
    assert got["observedGeneration"] == 1 and FINALIZER in kube.objects[PATH]["metadata"]["finalizers"]


async def test_a_provider_config_that_turns_bad_keeps_the_last_good_one_in_force() -> None:
    kube = world(good(failureFraction=0.8))
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)
    assert set(await source.desired()) == {NS}
    kube.objects[PATH]["spec"]["providerConfig"] = good(failureFraction="high")
    await listed(source)
    desired = await source.desired()
    protection = desired[NS].protection
    assert protection is not None and protection.failure_fraction == 0.8
    assert source.problems(NS) == ("providerConfig.failureFraction: 'high' is not a number",)


async def test_an_owners_opt_out_and_the_clusters_lifecycle_each_serve_nothing() -> None:
    """Only the Cluster's lifecycle says gardenlet decides the controllers (``skipped``: what is
    held is handed back); an opt-out leaves nobody to raise them (``unserved``: restored)."""
    for kube, skipped, unserved in (
        (world(good(disabled=True)), {}, {NS: "its providerConfig says disabled"}),
        (world(hibernation=True), {NS: "hibernated"}, {}),
    ):
        source = ExtensionSource(kube, SETTINGS)
        await listed(source)
        assert await source.desired() == {}
        assert (source.skipped, source.unserved) == (skipped, unserved)
    # No Extension of ours: not served, and nothing to hand back for (the sweep's to restore).
    kube = world()
    kube.objects[PATH]["spec"]["type"] = "shoot-dns-service"
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)
    assert await source.desired() == {} and source.skipped == {}


def held_down(kube: FakeKube) -> None:
    record = json.dumps({"format": 2, "replicas": 1, "episode": "e-1"})
    kube.objects[deployment_path(KCM)]["spec"]["replicas"] = 0
    kube.objects[deployment_path(KCM)]["metadata"].update(
        annotations={RECORD: record, REPLICAS: "1", MELTDOWN: ""}, labels={RECORD: "1"}
    )


def controllers_follow(kube: FakeKube) -> None:
    """The deployment controller: each Deployment's pods as its spec asks."""
    for name in (KCM, MCM, CA):
        obj = kube.objects[deployment_path(name)]
        replicas = obj["spec"]["replicas"]
        obj["status"] = {"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas}


async def deleted_while_held_down(kube: FakeKube) -> ExtensionSource:
    """The Extension answered, then deleted while KCM is held down by a record of ours."""
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)
    await reconciler(kube, source).reconcile_all()
    held_down(kube)
    kube.objects[PATH]["metadata"]["deletionTimestamp"] = DELETED_AT
    await listed(source)
    return source


async def delete_held_down(kube: FakeKube) -> list[tuple[str, str]]:
    """The reconciler's passes over an Extension deleted while held down, until it has let go.
    Its status writes."""
    source = await deleted_while_held_down(kube)
    assert await source.desired() == {}
    # Its target still runs: nothing is given back under it.
    writes = len(kube.writes)
    await reconciler(kube, source, served={NS}).reconcile_all()
    assert len(kube.writes) == writes and PATH in kube.objects
    for _ in range(5):
        await reconciler(kube, source).reconcile_all()
        controllers_follow(kube)
        if PATH not in kube.objects:  # our finalizer, the last, dropped: the server deleted it
            break
        await listed(source)
    assert PATH not in kube.objects
    return status_writes(kube)


async def test_an_extension_deleted_while_the_shoot_is_held_down_restores_then_lets_go() -> None:
    """The owner removed the extension in an outage: nobody else would raise what we hold down
    (gardenlet deployed KCM while our marks were on), so it comes back at its recorded count."""
    kube = world()
    writes = await delete_held_down(kube)
    kcm = kube.objects[deployment_path(KCM)]
    assert kcm["spec"]["replicas"] == 1
    assert not {RECORD, MELTDOWN, REPLICAS} & set(kcm["metadata"].get("annotations") or {})
    assert [w for w in writes if w[0] == "Delete"] == [("Delete", "Processing"), ("Delete", "Succeeded")]


async def test_an_extension_deleted_with_its_hibernated_shoot_hands_back_then_lets_go() -> None:
    kube = world(hibernation=True, hibernated=True)
    writes = await delete_held_down(kube)
    kcm = kube.objects[deployment_path(KCM)]
    assert kcm["spec"]["replicas"] == 0  # gardenlet decides it now
    assert not {RECORD, MELTDOWN} & set(kcm["metadata"].get("annotations") or {})
    assert writes[-2:] == [("Delete", "Processing"), ("Delete", "Succeeded")]


async def test_a_hand_back_that_fails_keeps_the_finalizer_and_says_why() -> None:
    kube = world()
    source = await deleted_while_held_down(kube)
    kube.fail("PATCH", f"deployments/{KCM}$")
    await reconciler(kube, source).reconcile_all()
    assert kube.objects[PATH]["metadata"]["finalizers"] == [FINALIZER]
    got = status(kube)
    assert got["lastOperation"]["state"] == "Error" and got["lastError"]["description"].startswith(f"{KCM}: ")
    kube.clear()
    await listed(source)
    await reconciler(kube, source).reconcile_all()
    assert PATH not in kube.objects


async def test_a_controller_restarted_mid_operation_finishes_it() -> None:
    """Stopped after the Processing write: the annotation is still there, the status says
    Processing; a new process reads that and finishes."""
    kube = world()
    obj = kube.objects[PATH]
    obj["metadata"]["finalizers"] = [FINALIZER]
    obj["status"] = extension_status("Processing", NOW, observed_generation=0)
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)
    await reconciler(kube, source).reconcile_all()
    assert OPERATION not in kube.objects[PATH]["metadata"]["annotations"]
    assert status(kube)["lastOperation"]["state"] == "Succeeded"


async def test_only_the_leader_writes() -> None:
    kube = world()
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)

    class Standby:
        def leading(self) -> bool:
            return False

        def scope(self, namespace: str) -> Scope:
            return Scope(leads=lambda: False)

    writes = len(kube.writes)
    await reconciler(kube, source, leadership=Standby()).reconcile_all()
    assert len(kube.writes) == writes


def view(**changes: Any) -> ExtensionView:
    base = ExtensionView(
        namespace=NS,
        name="dwd-lease",
        type="dwd-lease",
        generation=2,
        resource_version="7",
        deleting=False,
        finalizers=("other", FINALIZER),
        operation="",
        timestamp="",
        observed_generation=2,
        last_operation=("Reconcile", "Succeeded", "protection configured"),
        last_error="",
    )
    return ExtensionView(**{**base.__dict__, **changes})


def test_what_asks_for_a_reconcile() -> None:
    """gardenlet's annotation, or at the first look an operation that did not succeed: nothing
    else (Gardener's DefaultPredicates)."""
    assert not wants_reconcile(view(), first_look=True)
    assert wants_reconcile(view(operation="reconcile"), first_look=False)
    assert wants_reconcile(view(operation="restore"), first_look=False)
    assert not wants_reconcile(view(operation="wait-for-state"), first_look=True)
    processing = ("Reconcile", "Processing", "Reconcile in progress")
    assert wants_reconcile(view(last_operation=processing), first_look=True)
    assert not wants_reconcile(view(last_operation=processing), first_look=False)
    assert wants_reconcile(view(last_operation=("", "", "")), first_look=True)
    for unasked in (view(observed_generation=1), view(finalizers=("other",))):
        assert not wants_reconcile(unasked, first_look=False)


def test_the_operation_is_computed_as_gardener_computes_it() -> None:
    """``v1beta1helper.ComputeOperationType``, case by case."""
    cases = [
        (view(operation="migrate", deleting=True), "Migrate"),
        (view(deleting=True, operation="restore"), "Delete"),
        (view(operation="restore"), "Restore"),
        (view(last_operation=("", "", "")), "Create"),
        (view(last_operation=("Create", "Error", "x")), "Create"),
        (view(last_operation=("Create", "Succeeded", "x")), "Reconcile"),
        (view(last_operation=("Migrate", "Processing", "x")), "Migrate"),
        (view(last_operation=("Restore", "Error", "x")), "Restore"),
        (view(last_operation=("Restore", "Succeeded", "x")), "Reconcile"),
        (view(last_operation=("Delete", "Error", "x")), "Reconcile"),
    ]
    assert [operation_type(v) for v, _ in cases] == [kind for _, kind in cases]


def test_the_claim_keeps_the_others_finalizers_and_is_conditional() -> None:
    assert claim(view(finalizers=("other",), operation="reconcile")) == {
        "metadata": {
            "resourceVersion": "7",
            "finalizers": ["other", FINALIZER],
            "annotations": {OPERATION: None},
        }
    }
    assert claim(view()) == {"metadata": {"resourceVersion": "7", "finalizers": ["other", FINALIZER]}}
    # A restore keeps its annotation until it has succeeded (the library removes it last).
    assert claim(view(operation="restore")) == {
        "metadata": {"resourceVersion": "7", "finalizers": ["other", FINALIZER]}
    }
