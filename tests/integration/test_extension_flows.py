"""gardenlet's own code asked what it makes of each of the extension's flows
(tests/unit/test_extension_flows.py runs them against the fake seed): its verdict on the
Extension (``health.CheckExtensionObject``, with the error codes it classifies) and what its
shoot care makes of our condition for the Shoot's (``checker.CheckExtensionCondition``, with the
heartbeat beside it). Each Extension is decoded strictly by Gardener's types first."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from aggregator.extension.contract import OPERATION
from aggregator.extension.health import heartbeat
from aggregator.model.verdict import Phase
from testenv.gardener import gardener_types, grm
from testenv.gardener.seed_objects import DELETED_AT
from testenv.kube.controllers import KCM
from tests.unit.test_extension import PATH, good, held_down, status
from tests.unit.test_extension_flows import FALSE_BEFORE, TRUE_BEFORE, Flow, flow
from tests.unit.test_extension_health import Judged
from tests.unit.world import NS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.builds(grm.NAME),
    pytest.mark.usefixtures("gardener_checker"),
]


def gardenlet(f: Flow) -> tuple[str, str]:
    """gardenlet's verdict on the Extension ("" = ready) and on the Shoot's condition from ours
    ("" = left to its other checks), the Extension checked by Gardener's types first."""
    obj = f.extension
    assert gardener_types.strict_errors([obj]) == [""], json.dumps(obj)
    (ready,) = gardener_types.extension_verdicts([obj])
    beat = heartbeat("garden", "dwd-lease", 30, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    ((shoot, reason, _),) = gardener_types.shoot_conditions([(obj, beat)])
    return ready, f"{shoot} {reason}".strip()


def said(f: Flow) -> str:
    c = f.condition()
    return "(none)" if c is None else f"{c['status']} {c['reason']}"


async def test_health_tells_the_truth_about_the_shoot() -> None:
    rows: list[tuple[str, Flow, str]] = []
    small = flow(answered=True)
    small.served, small.judged = (
        {NS},
        (Judged(judging=False, reason="no verdict: 1 candidate(s), fewer than 3"), ""),
    )
    rows.append(("a 1-node shoot", small, "True QuorumNotJudged"))
    dry = flow(good(dryRun=True), answered=True)
    dry.served, dry.judged = {NS}, (Judged(phase=Phase.DOWN), "")
    rows.append(("a dry run during a cut", dry, "True DryRun"))
    restart = flow(answered=True, condition=TRUE_BEFORE)
    restart.served, restart.judged = {NS}, (None, "")
    rows.append(("an aggregator restart", restart, "True ProtectionActive"))
    rows.append(
        (
            "opted out, False before",
            flow(good(disabled=True), answered=True, condition=FALSE_BEFORE),
            "True ProtectionDisabled",
        )
    )
    rows.append(
        (
            "hibernated, False before",
            flow(answered=True, condition=FALSE_BEFORE, hibernation=True, hibernated=True),
            "True ShootHibernated",
        )
    )
    blind = flow(answered=True)
    blind.served, blind.judged = {NS}, (Judged(view="leases: watch failed 40s ago"), "")
    rows.append(("no trusted view (broken)", blind, "False ProtectionOff"))
    for why, f, want in rows:
        await f.run(passes=2)
        ready, shoot = gardenlet(f)
        print(
            f"{why}: ours {said(f)}; gardenlet: Extension {ready or 'ready'}, "
            f"Shoot {shoot or 'left to its other checks'}"
        )
        assert said(f) == want and ready == ""
        assert shoot == ("" if want.startswith("True") else "False ExtensionUnhealthyReport"), why


async def test_the_operations_as_gardeners_library_answers_them() -> None:
    # wait-for-state: untouched, as gardenlet created it.
    waiting = flow(annotations={OPERATION: "wait-for-state"})
    await waiting.run(passes=2)
    ready, _ = gardenlet(waiting)
    print(f"wait-for-state: untouched; gardenlet: {ready}")
    assert "status" not in waiting.extension and not waiting.extension["metadata"].get("finalizers")

    # A restore that fails is a Restore Error gardenlet waits on, its annotation kept; then done.
    restore = flow(answered=True, annotations={OPERATION: "restore"})
    restore.kube.fail("POST", "managedresources$")
    restore.kube.fail("PATCH", "managedresources/dwd-lease-shoot$")
    await restore.run()
    failed, _ = gardenlet(restore)
    print(f"a restore that failed: gardenlet: {failed}")
    assert failed.startswith("error during reconciliation: delivering the shoot part")
    restore.kube.clear()
    restore.now += 60
    await restore.run()
    assert gardenlet(restore)[0] == "" and OPERATION not in restore.extension["metadata"]["annotations"]

    # A bad providerConfig: the owner's error, which gardenlet does not retry on its own.
    bad = flow(good(failureFraction=1.5))
    await bad.run()
    verdict, _ = gardenlet(bad)
    print(f"a bad providerConfig: gardenlet: {verdict}")
    assert "ERR_CONFIGURATION_PROBLEM" in verdict and verdict.endswith("non-retryable]")
    assert status(bad.kube)["lastOperation"]["type"] == "Create"

    # A failed shoot: skipped, as every Gardener extension skips it.
    failed_shoot = flow(last_operation=("Reconcile", "Failed"))
    await failed_shoot.run()
    verdict, _ = gardenlet(failed_shoot)
    print(f"a failed shoot: gardenlet: {verdict}")
    assert verdict and "status" not in failed_shoot.extension


async def test_a_force_deletion_never_waits_on_us() -> None:
    f = flow(answered=True, force_deletion="true", deleting=True)
    held_down(f.kube)
    obj: dict[str, Any] = f.kube.objects[PATH]
    obj["metadata"]["deletionTimestamp"] = DELETED_AT
    f.kube.fail("PATCH", f"deployments/{KCM}$")
    await f.run()
    gone = PATH not in f.kube.objects
    print(f"force deletion with the hand-back refused: the Extension {'gone' if gone else 'kept'}")
    assert gone
