"""At the garden's door, with Gardener's own API server (testenv/gardener/garden.py): the
extension's registration accepted by gardener-apiserver's validation, and a Shoot whose dwd-lease
providerConfig is bad refused at its create or update by the door
(manifests/gardener/garden/admission-policy.yaml) with a message naming the field and what it
allows; a good one, a Shoot without our extension and an unchanged config never refused; and the
door and the aggregator's own rules (aggregator/model/protection.py ``check``) of one verdict over
one corpus (tests/unit/door_corpus.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.model import door
from aggregator.model.protection import check
from core.errors import ConfigError, Invalid, KubeError
from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.gardener import garden, grm
from testenv.kube.controlplane import ControlPlane
from tests.unit.door_corpus import BASE, corpus

pytestmark = [pytest.mark.integration, pytest.mark.builds(grm.NAME)]

ROOT = Path(__file__).resolve().parents[2]
REGISTRATION = ROOT / "manifests" / "gardener" / "extension" / "controller-registration.yaml"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
GOOD = {**BASE, "failureFraction": 0.7}


def extensions(config: Any) -> list[dict[str, Any]]:
    return [{"type": door.EXTENSION_TYPE, "providerConfig": config}]


def refusal(admin: Client, body: dict[str, Any], *, dry_run: bool = True) -> str:
    """The door's (or Gardener's) refusal of creating ``body``, "" where it is accepted."""
    try:
        admin.request("POST", garden.shoots_path(), body, params={"dryRun": "All"} if dry_run else None)
    except Invalid as e:
        return str(e)
    return ""


def _registered(admin: Client) -> list[dict[str, Any]]:
    out = []
    for doc in yaml.safe_load_all(REGISTRATION.read_text()):
        version = doc["apiVersion"].split("/")[1]
        out.append(admin.create(f"/apis/core.gardener.cloud/{version}/{doc['kind'].lower()}s", doc))
    return out


def _door(admin: Client) -> None:
    """The door's policy and binding, in force once a bad config is refused."""
    for doc in yaml.safe_load_all((ROOT / door.TARGET).read_text()):
        admin.ensure(POLICIES if doc["kind"] == "ValidatingAdmissionPolicy" else BINDINGS, doc)
    bad = garden.shoot("probe", extensions({**GOOD, "failureFraction": 2}))
    wait_for(lambda: refusal(admin, bad) != "", 30, "the door in force")


@pytest.fixture(scope="module")
def admin() -> Iterator[Client]:
    t0 = time.monotonic()
    with ControlPlane(aggregation=True).running() as cp:
        t1 = time.monotonic()
        with garden.Garden(cp).running(), cp.admin_client() as client:
            t2 = time.monotonic()
            garden.landscape(client)
            registered = _registered(client)
            print(
                f"\nthe garden: kube-apiserver {t1 - t0:.1f}s, gardener-apiserver registered {t2 - t1:.1f}s; "
                f"accepted by it: {', '.join(o['kind'] + ' ' + o['metadata']['name'] for o in registered)}"
            )
            _door(client)
            yield client


def test_the_registration_is_gardeners_to_accept(admin: Client) -> None:
    """Read back as gardener-apiserver stored it: our extension type and its lifecycle."""
    reg = admin.get("/apis/core.gardener.cloud/v1beta1/controllerregistrations/dwd-lease")
    (resource,) = reg["spec"]["resources"]
    assert (resource["kind"], resource["type"], resource["autoEnable"]) == (
        "Extension",
        "dwd-lease",
        ["shoot"],
    )
    assert admin.get("/apis/core.gardener.cloud/v1/controllerdeployments/dwd-lease")["helm"]["rawChart"]


def test_a_bad_config_is_refused_at_the_door_and_a_good_one_is_not(admin: Client) -> None:
    admin.create(garden.shoots_path(), garden.shoot("good", extensions(GOOD)))
    path = f"{garden.shoots_path()}/good"
    for field, bad, allowed in (
        ("failureFraction", 1.5, "a fraction in (0, 1]"),
        ("dryrun", True, "unknown field"),
        ("dryRun", "yes", "a boolean (true or false)"),
    ):
        with pytest.raises(Invalid) as refused:
            admin.merge_patch(path, {"spec": {"extensions": extensions({**GOOD, field: bad})}})
        print(f"{field}: {bad!r} refused: {refused.value}")
        assert f"providerConfig.{field}: " in str(refused.value) and allowed in str(refused.value)
    admin.merge_patch(path, {"spec": {"extensions": extensions({**GOOD, "dryRun": True})}})
    assert refusal(admin, garden.shoot("plain")) == ""  # no dwd-lease extension: never judged


def test_an_unchanged_config_is_never_refused(admin: Client) -> None:
    """A Shoot whose config was taken before the door (or a rule) existed: updated otherwise,
    it passes; its config changed to another bad one, it is refused."""
    binding = f"{BINDINGS}/{door.NAME}"
    held = admin.get(binding)
    admin.delete(binding)
    legacy = garden.shoot("legacy", extensions({**GOOD, "failureFraction": 3}))
    wait_for(lambda: refusal(admin, legacy) == "", 30, "the door open")
    admin.create(garden.shoots_path(), legacy)
    admin.create(
        BINDINGS, {k: held[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": door.NAME}}
    )
    _door(admin)
    path = f"{garden.shoots_path()}/legacy"
    admin.merge_patch(path, {"metadata": {"labels": {"team": "a"}}})
    with pytest.raises(Invalid):
        admin.merge_patch(path, {"spec": {"extensions": extensions({**GOOD, "failureFraction": 4})}})


def test_the_door_and_the_aggregator_agree_over_one_corpus(admin: Client) -> None:
    disagreements = []
    refused = 0
    for what, config in corpus():
        try:
            check(config)
            ours = ""
        except ConfigError as e:
            ours = "; ".join(e.problems)
        doors = refusal(admin, garden.shoot("corpus", extensions(config)))
        refused += bool(doors)
        if bool(ours) != bool(doors):
            disagreements.append(f"{what}: aggregator {ours or 'takes it'}; door {doors or 'takes it'}")
    print(
        f"corpus: {len(corpus())} configs, {refused} refused at the door, {len(disagreements)} disagreements"
    )
    assert disagreements == []


def test_the_door_refuses_only_what_gardener_does_not(admin: Client) -> None:
    """A Shoot Gardener itself refuses is refused for Gardener's reason, not the door's."""
    broken = garden.shoot("broken", extensions(GOOD))
    broken["spec"]["kubernetes"]["version"] = "9.9.9"
    with pytest.raises(KubeError) as refused:
        admin.create(garden.shoots_path(), broken)
    assert door.NAME not in str(refused.value)
