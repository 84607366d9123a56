"""The extension in every shoot's flow, as Gardener's extension library and its shoot extensions
behave (gardener/gardener v1.149.3 ``extensions/pkg/controller/extension/reconciler.go``,
``pkg/controllerutils/reconciler/operation_annotation_wrapper.go``,
``extensions/pkg/predicate/default.go``, ``extensions/pkg/controller/status.go``,
``extensions/pkg/controller/healthcheck/reconciler.go``), against the fake seed: what each flow
leaves on the Extension. tests/integration/test_extension_flows.py asks gardenlet's own code what
it makes of each result (``CheckExtensionObject``, ``CheckExtensionCondition``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aggregator.extension.contract import FINALIZER, OPERATION, TIMESTAMP
from aggregator.extension.delivery import MANAGED_RESOURCE, managed_resource_path
from aggregator.extension.health import HEARTBEAT, LEASES
from aggregator.extension.reconciler import Reconciler
from aggregator.extension.source import ExtensionSource
from aggregator.model.verdict import Phase
from core.errors import KubeError
from testenv.gardener.seed_objects import DELETED_AT, extension_status
from testenv.kube.controllers import KCM
from tests.unit.fakekube import FakeKube
from tests.unit.test_extension import (
    PATH,
    SETTINGS,
    controllers_follow,
    good,
    held_down,
    listed,
    reconciler,
    status,
    status_writes,
    world,
)
from tests.unit.test_extension_delivery import part as shoot_part
from tests.unit.test_extension_health import Judged
from tests.unit.world import NS

HEARTBEAT_NS = "extension-dwd-lease"
TRUE_BEFORE = {
    "type": "SystemComponentsHealthy",
    "status": "True",
    "reason": "ProtectionActive",
    "message": "dwd-lease judges the nodes' agents and protects the shoot",
    "lastUpdateTime": "2026-01-01T00:00:00Z",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}
FALSE_BEFORE = {
    **TRUE_BEFORE,
    "status": "False",
    "reason": "ProtectionOff",
    "message": "dwd-lease cannot judge a quorum: no verdict: 2 candidate(s), fewer than 3",
}


@dataclass
class Flow:
    """One step of a shoot's life through its Extension, on the fake seed: what the reconciler
    was shown, and the Extension and heartbeat it left."""

    kube: FakeKube
    source: ExtensionSource
    served: set[str] = field(default_factory=set)
    judged: tuple[Judged | None, str] = (None, "")
    now: float = 1000.0
    reconciler: Reconciler | None = None

    async def run(self, passes: int = 1, *, every_s: float = 0.0) -> None:
        """``passes`` of one controller's loop, ``every_s`` apart, each after the fleet's look."""
        if self.reconciler is None:
            self.reconciler = reconciler(
                self.kube,
                self.source,
                served=lambda: self.served,
                health_of=lambda ns: self.judged,
                heartbeat_ns=HEARTBEAT_NS,
                part=shoot_part(),
                clock=lambda: self.now,
            )
        for _ in range(passes):
            await listed(self.source)
            with contextlib.suppress(KubeError):
                await self.source.desired()
            await self.reconciler.reconcile_all()
            controllers_follow(self.kube)
            self.now += every_s

    @property
    def extension(self) -> dict[str, Any]:
        return dict(self.kube.objects.get(PATH) or {})

    @property
    def heartbeat(self) -> dict[str, Any] | None:
        return self.kube.objects.get(LEASES.format(ns=HEARTBEAT_NS) + "/" + HEARTBEAT)

    def condition(self) -> dict[str, Any] | None:
        conditions = status(self.kube).get("conditions") or ()
        return next((c for c in conditions if c["type"] == "SystemComponentsHealthy"), None)

    def extension_writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _ in self.kube.writes if p.startswith(PATH)]


def flow(
    provider_config: dict[str, Any] | None = None,
    *,
    answered: bool = False,
    condition: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    **cluster_fields: Any,
) -> Flow:
    """A seed with the shoot's Extension: as gardenlet asks for it, or ``answered`` already by a
    controller (our finalizer on, Reconcile Succeeded, no annotation), with ``condition`` as last
    written and the operation ``annotations`` given."""
    kube = world(provider_config, **cluster_fields)
    obj = kube.objects[PATH]
    if answered:
        obj["metadata"]["finalizers"] = [FINALIZER]
        obj["metadata"]["annotations"] = {TIMESTAMP: "2026-01-01T00:00:00Z"}
        obj["status"] = extension_status("Succeeded", "2026-01-01T00:00:01Z", observed_generation=1)
    if condition is not None:
        obj.setdefault("status", {})["conditions"] = [dict(condition)]
    if annotations is not None:
        obj["metadata"]["annotations"] = {**obj["metadata"].get("annotations", {}), **annotations}
    return Flow(kube, ExtensionSource(kube, SETTINGS))


# --- Health that tells the truth about the shoot ----------------------------------------------


async def test_a_shoot_too_small_to_judge_is_healthy_and_says_why() -> None:
    f = flow(answered=True)
    f.served, f.judged = {NS}, (Judged(judging=False, reason="no verdict: 1 candidate(s), fewer than 3"), "")
    await f.run()
    c = f.condition()
    assert c is not None and (c["status"], c["reason"]) == ("True", "QuorumNotJudged"), c
    assert c["message"].endswith("no verdict: 1 candidate(s), fewer than 3")


async def test_a_dry_run_is_healthy_and_never_claims_to_hold_anything_down() -> None:
    for phase in (Phase.HEALTHY, Phase.DOWN):
        f = flow(good(dryRun=True), answered=True)
        f.served, f.judged = {NS}, (Judged(phase=phase), "")
        await f.run()
        c = f.condition()
        assert c is not None and (c["status"], c["reason"]) == ("True", "DryRun"), (phase, c)


async def test_a_start_or_a_new_leader_writes_no_condition() -> None:
    """Starting to judge (no target yet, the record being read, the view opening) says nothing
    new: what was said stands, and gardenlet's Shoot condition does not move."""
    for judged in (None, Judged(phase=Phase.STARTING), Judged(judging=False, view="x", view_opening=True)):
        f = flow(answered=True, condition=TRUE_BEFORE)
        f.served, f.judged = {NS}, (judged, "")
        await f.run(passes=2)
        assert f.condition() == TRUE_BEFORE
        assert f.extension_writes() == [], judged


async def test_a_shoot_no_longer_served_gets_a_condition_that_says_why() -> None:
    """An opt-out or a hibernation while the Extension stays: its last condition (False here)
    is replaced, as Gardener's healthcheck library re-evaluates every sync period."""
    cases: list[tuple[Callable[[], Flow], str, str]] = [
        (
            lambda: flow(good(disabled=True), answered=True, condition=FALSE_BEFORE),
            "True",
            "ProtectionDisabled",
        ),
        (
            lambda: flow(answered=True, condition=FALSE_BEFORE, hibernation=True, hibernated=True),
            "True",
            "ShootHibernated",
        ),
        (lambda: flow(answered=True, condition=FALSE_BEFORE, workers=0), "True", "NoWorkers"),
    ]
    for make, want, reason in cases:
        f = make()
        await f.run()
        c = f.condition()
        assert c is not None and (c["status"], c["reason"]) == (want, reason), c


# --- The operation annotations as Gardener's library reads them -------------------------------


async def test_wait_for_state_is_left_alone() -> None:
    f = flow(annotations={OPERATION: "wait-for-state"})
    f.served, f.judged = {NS}, (Judged(), "")
    await f.run(passes=2)
    assert f.extension_writes() == []
    assert not any(p.startswith(managed_resource_path(NS).rsplit("/", 1)[0]) for _, p, _ in f.kube.writes)
    assert await f.source.desired() == {} and f.source.unserved[NS].startswith("its Extension waits")


async def test_a_restore_keeps_its_annotation_until_it_succeeds_and_is_retried_as_a_restore() -> None:
    f = flow(answered=True, annotations={OPERATION: "restore"})
    f.kube.fail("POST", "managedresources$")
    f.kube.fail("PATCH", f"managedresources/{MANAGED_RESOURCE}$")
    await f.run()
    assert status(f.kube)["lastOperation"]["type"] == "Restore"
    assert status(f.kube)["lastOperation"]["state"] == "Error"
    assert f.extension["metadata"]["annotations"].get(OPERATION) == "restore"
    f.kube.clear()
    writes = len(f.kube.writes)
    await f.run(passes=3, every_s=1.0)
    assert len(f.kube.writes) == writes  # backed off: gardenlet has asked nothing new
    await f.run(passes=2, every_s=SETTINGS.shoots.poll_s)
    assert status_writes(f.kube)[-2:] == [("Restore", "Processing"), ("Restore", "Succeeded")]
    assert OPERATION not in f.extension["metadata"]["annotations"]


async def test_a_failed_shoot_is_skipped() -> None:
    f = flow(last_operation=("Reconcile", "Failed"))
    await f.run()
    assert f.extension_writes() == []


async def test_only_gardenlets_annotation_a_deletion_or_a_start_reconciles() -> None:
    """After the first look, nothing but the annotation (or a deletion) asks for a reconcile: not
    a generation gardenlet has not annotated, nor our finalizer gone, nor a seed-wide setting that
    now reads the providerConfig otherwise."""
    f = flow(answered=True)
    await f.run()
    assert f.extension_writes() == []  # answered already, and Succeeded: nothing at the start
    obj = f.kube.objects[PATH]
    obj["metadata"]["generation"] = 2
    obj["metadata"]["finalizers"] = []
    await f.run()
    assert f.extension_writes() == []
    obj["metadata"]["annotations"][OPERATION] = "reconcile"
    await f.run()
    assert status_writes(f.kube) == [("Reconcile", "Processing"), ("Reconcile", "Succeeded")]
    assert f.extension["status"]["observedGeneration"] == 2


async def test_a_start_reconciles_what_did_not_succeed() -> None:
    f = flow(answered=True)
    f.kube.objects[PATH]["status"] = extension_status("Error", "2026-01-01T00:00:01Z")
    await f.run()
    assert status_writes(f.kube) == [("Reconcile", "Processing"), ("Reconcile", "Succeeded")]


async def test_the_last_operation_as_the_library_writes_it() -> None:
    """Create when there was none; progress 1 while Processing, 50 on Error, 100 on success; a bad
    providerConfig's error coded ERR_CONFIGURATION_PROBLEM, the owner's to fix."""
    f = flow()
    await f.run()
    bodies = [b["status"]["lastOperation"] for m, p, b in f.kube.writes if p == PATH + "/status"]
    assert [(b["type"], b["state"], b["progress"]) for b in bodies] == [
        ("Create", "Processing", 1),
        ("Create", "Succeeded", 100),
    ]
    f = flow(good(failureFraction=1.5))
    await f.run()
    got = status(f.kube)
    assert (got["lastOperation"]["type"], got["lastOperation"]["progress"]) == ("Create", 50)
    assert got["lastError"]["codes"] == ["ERR_CONFIGURATION_PROBLEM"]


# --- Flows that never wait on us --------------------------------------------------------------


async def test_a_force_deletion_lets_go_even_when_the_hand_back_is_refused() -> None:
    f = flow(answered=True, force_deletion="true", deleting=True)
    held_down(f.kube)
    f.kube.objects[PATH]["metadata"]["deletionTimestamp"] = DELETED_AT
    f.kube.fail("PATCH", f"deployments/{KCM}$")
    await f.run()
    assert PATH not in f.kube.objects, status(f.kube)
    assert status_writes(f.kube)[-1] == ("Delete", "Succeeded")


async def test_a_hibernation_answers_at_once_and_keeps_the_shoot_part() -> None:
    f = flow(answered=True, hibernation=True)
    f.kube.put(managed_resource_path(NS), {"metadata": {"name": MANAGED_RESOURCE, "namespace": NS}})
    f.kube.objects[PATH]["metadata"]["annotations"][OPERATION] = "reconcile"
    await f.run()
    assert status(f.kube)["lastOperation"]["state"] == "Succeeded"
    assert managed_resource_path(NS) in f.kube.objects
    assert not any(m == "DELETE" for m, _, _ in f.kube.writes)


async def test_a_condition_is_not_written_again_from_a_cache_our_write_went_past() -> None:
    """The informer's cache a moment behind our condition write: the next pass must not write the
    same condition again (seen 1 in 250 in bench/extensions.py), nor reset its transition time."""
    f = flow(answered=True)
    f.served, f.judged = {NS}, (Judged(), "")
    await f.run()
    assert f.condition() is not None
    stale = f.source.extensions[NS]  # as listed before the write
    writes = len(f.kube.writes)
    assert f.reconciler is not None
    await f.reconciler.reconcile_all()  # the cache still holds ``stale``
    assert f.source.extensions[NS] is stale and len(f.kube.writes) == writes


async def test_a_deletion_that_fails_is_tried_again_after_a_backoff_not_every_pass() -> None:
    """A refused hand-back is Delete Error, tried again as the library's rate limiter would:
    not two status writes every pass for as long as it is refused."""
    f = flow(answered=True)
    held_down(f.kube)
    f.kube.objects[PATH]["metadata"]["deletionTimestamp"] = DELETED_AT
    f.kube.fail("PATCH", f"deployments/{KCM}$")
    await f.run()
    assert status_writes(f.kube)[-1] == ("Delete", "Error")
    writes = len(status_writes(f.kube))
    await f.run(passes=3, every_s=1.0)
    assert len(status_writes(f.kube)) == writes
    f.kube.clear()
    await f.run(passes=2, every_s=SETTINGS.shoots.retry.first_s)
    assert PATH not in f.kube.objects


async def test_a_deletion_does_not_wait_out_a_failed_reconciles_backoff() -> None:
    """A bad providerConfig failed its reconcile (backed off); then the Extension is deleted, which
    raises its generation once, as the API server does: the deletion goes ahead at once."""
    f = flow(good(failureFraction=1.5))
    await f.run()
    assert status_writes(f.kube)[-1] == ("Create", "Error")
    obj = f.kube.objects[PATH]
    obj["metadata"]["deletionTimestamp"] = DELETED_AT
    obj["metadata"]["generation"] += 1
    await f.run(passes=2)
    assert PATH not in f.kube.objects
