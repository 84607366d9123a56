"""The aggregator as Gardener's extension controller (DWD_TARGETS=extension) against a real seed
kube-apiserver: an Extension as gardenlet creates it, with a bad providerConfig and then a good
one, a cut that holds the shoot down, a restart in the middle of an operation, and the
Extension deleted while the shoot is held down. One control plane, one aggregator at a time.

Every Extension read back is decoded strictly by Gardener's own types (testenv/gardener/gardener_types.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from aggregator.extension.contract import FINALIZER, OPERATION
from aggregator.model.protection import API_VERSION, KIND
from aggregator.model.records import MELTDOWN, RECORD
from core.errors import NotFound
from testenv.base.process import Process
from testenv.base.wait import wait_for
from testenv.gardener import grm
from testenv.gardener.apply import RESOURCES, apply
from testenv.gardener.gardener_types import extension_verdicts, strict_errors
from testenv.gardener.seed_objects import cluster, extension, extension_status, module_crds
from testenv.kube.controllers import CONTROLLERS, DOWN, KCM
from testenv.kube.controlplane import free_port
from testenv.worlds.shoot_world import Shoot
from tests.integration.test_service import FILE_MODE, status, up

pytestmark = [pytest.mark.integration, pytest.mark.builds(grm.NAME)]


def extension_path(namespace: str) -> str:
    return f"/apis/extensions.gardener.cloud/v1alpha1/namespaces/{namespace}/extensions/dwd-lease"


def read(shoot: Shoot) -> str:
    """The Extension as the server has it, checked by Gardener's types: gardenlet's verdict on it
    (health.CheckExtensionObject, "" where it counts it ready), printed for the record."""
    obj = shoot.seed_admin.get(extension_path(shoot.namespace))
    assert strict_errors([obj]) == [""], json.dumps(obj)
    (verdict,) = extension_verdicts([obj])
    last = obj["status"]["lastOperation"]
    print(f"lastOperation {last['type']} {last['state']}: gardenlet says {verdict or 'ready'}")
    return verdict


def finished(shoot: Shoot) -> dict[str, Any] | None:
    """The Extension once its operation is answered (annotation gone, last operation done)."""
    obj = shoot.seed_admin.get(extension_path(shoot.namespace))
    last = (obj.get("status") or {}).get("lastOperation") or {}
    annotations = obj["metadata"].get("annotations") or {}
    done = OPERATION not in annotations and last.get("state") in ("Succeeded", "Error")
    return obj if done and obj["status"].get("observedGeneration") == obj["metadata"]["generation"] else None


def start(shoot: Shoot, port: int) -> Process:
    agg = shoot.start_aggregator(
        {**FILE_MODE, "DWD_TARGETS": "extension", "DWD_METRICS_ADDR": f"127.0.0.1:{port}"}
    )
    wait_for(lambda: up(port), 30, f"the aggregator ready (log: {agg.log_path})")
    return agg


def served(port: int) -> set[str]:
    return {t["namespace"] for t in status(port)["targets"]}


def test_the_extension_contract_from_create_to_delete(shoot: Shoot) -> None:
    RESOURCES.setdefault("Cluster", ("clusters", False))
    RESOURCES.setdefault("Extension", ("extensions", True))
    ns, path = shoot.namespace, extension_path(shoot.namespace)
    shoot.setup()
    shoot.store_access(shoot.aggregator_access("agg-token"))
    apply(shoot.seed_admin, module_crds("Cluster", "Extension"))
    wait_for(lambda: _established(shoot, "extensions") and _established(shoot, "clusters"), 20, "the CRDs")
    apply(shoot.seed_admin, [cluster(ns)])
    port = free_port()
    agg = start(shoot, port)

    # A bad providerConfig: the Extension says which field, and nothing is served.
    bad = {"apiVersion": API_VERSION, "kind": KIND, "failureFraction": 1.5}
    apply(shoot.seed_admin, [extension(ns, provider_config=bad)])
    obj = wait_for(lambda: finished(shoot), 20, "the bad providerConfig answered")
    assert obj["status"]["lastError"]["description"] == (
        "providerConfig.failureFraction: 1.5 is not a fraction in (0, 1]"
    )
    assert obj["metadata"]["finalizers"] == [FINALIZER] and served(port) == set()
    assert "providerConfig.failureFraction" in read(shoot)  # not ready, and says why

    # Fixed, as gardenlet writes it: a new generation and the reconcile annotation.
    good = {"apiVersion": API_VERSION, "kind": KIND, "failureFraction": 0.6}
    shoot.seed_admin.merge_patch(
        path, {"metadata": {"annotations": {OPERATION: "reconcile"}}, "spec": {"providerConfig": good}}
    )
    obj = wait_for(
        lambda: (o := finished(shoot)) and o["status"]["lastOperation"]["state"] == "Succeeded" and o,
        20,
        "the fixed providerConfig answered",
    )
    assert obj["status"].get("lastError") is None and obj["status"]["observedGeneration"] == 2
    wait_for(lambda: served(port) == {ns}, 20, "the shoot served")
    assert read(shoot) == ""  # ready, by gardenlet's own function
    shoot.wait_leases_renewed()  # a cut before the first renewals would leave nothing to judge

    # Every node's path cut: held down.
    shoot.driver.alive = set()
    wait_for(lambda: shoot.replicas() == DOWN, 30, "the controllers scaled down")

    # Stopped in the middle of an operation: annotated, and Processing already written.
    agg.kill()
    shoot.seed_admin.merge_patch(path, {"metadata": {"annotations": {OPERATION: "reconcile"}}})
    processing = extension_status("Processing", "2026-01-01T00:00:00Z", observed_generation=2)
    shoot.seed_admin.merge_patch(path + "/status", {"status": processing})
    agg = start(shoot, port)
    obj = wait_for(lambda: finished(shoot), 20, "the operation finished after the restart")
    assert obj["status"]["lastOperation"]["state"] == "Succeeded"
    assert read(shoot) == ""  # ready, by gardenlet's own function

    # Deleted while held down (the owner removed the extension; the shoot lives on): what we
    # hold down is restored, since nobody else would raise it, then the finalizer dropped.
    assert RECORD in (shoot.deployments()[KCM]["metadata"].get("annotations") or {})
    shoot.seed_admin.delete(path)
    wait_for(lambda: _gone(shoot, path), 30, f"the Extension gone (log: {agg.log_path})")
    assert shoot.replicas() == CONTROLLERS
    for obj in shoot.deployments().values():
        assert not {RECORD, MELTDOWN} & set(obj["metadata"].get("annotations") or {})
    assert served(port) == set()
    names = agg.names()
    assert "extension_deleted" in names and "target_removed" in names
    agg.kill()


def _gone(shoot: Shoot, path: str) -> bool:
    try:
        shoot.seed_admin.get(path)
    except NotFound:
        return True
    return False


def _established(shoot: Shoot, plural: str) -> bool:
    crd = shoot.seed_admin.get(
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.extensions.gardener.cloud"
    )
    return any(
        c["type"] == "Established" and c["status"] == "True"
        for c in (crd.get("status") or {}).get("conditions") or []
    )
