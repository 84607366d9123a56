"""At the garden's door, with Gardener's own API server (testenv/gardener/garden.py): the
extension's registration accepted by gardener-apiserver's validation, and a Shoot whose dwd-lease
providerConfig is bad refused at its create or update by the door
(manifests/gardener/garden/admission-policy.yaml) with a message naming the field and what it
allows; a good one, a Shoot without our extension and an unchanged config never refused; and the
door and the aggregator's own rules (aggregator/model/protection.py ``check``) of one verdict over
one corpus (tests/unit/door_corpus.py)."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.model import door
from aggregator.model.protection import check
from core.errors import ConfigError, Invalid, KubeError, NotFound
from image import charts, version
from testenv.base import binaries
from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.gardener import garden, gardener_types, grm, registration
from testenv.gardener.seed_objects import module_crds
from testenv.kube.controlplane import ControlPlane
from tests.unit.door_corpus import BASE, corpus

pytestmark = [pytest.mark.integration, pytest.mark.builds(grm.NAME)]

ROOT = Path(__file__).resolve().parents[2]
REGISTRATION = ROOT / registration.TARGET
OPERATOR_EXTENSION = ROOT / registration.OPERATOR_TARGET
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
OPERATOR_EXTENSIONS = "/apis/operator.gardener.cloud/v1alpha1/extensions"
# What gardener-operator mixes into the admission chart's values for the virtual garden.
OPERATOR_VALUES = {
    "gardener": {
        "virtualCluster": {
            "enabled": True,
            "serviceAccount": {"name": "extension-admission-dwd-lease", "namespace": "kube-system"},
        }
    }
}
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


def pulled(artifact: Path) -> bytes:
    """``artifact`` (image/charts.py) copied to a registry as docs/install.md says (skopeo), and
    taken from there by gardener-operator's puller."""
    name = artifact.name.removesuffix(".oci.tar")
    with gardener_types.registry() as host:
        ref = f"{host}/gardener/extensions/{name}:{version.current()}"
        subprocess.run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                f"oci-archive:{artifact}",
                f"docker://{ref}",
            ],
            check=True,
        )
        archive = gardener_types.pull_chart(ref)
    print(f"{name}: copied to {ref} by skopeo, pulled by gardener's HelmRegistry ({len(archive)} bytes)")
    return archive


def door_as_the_operator_installs_it(artifact: Path) -> list[dict[str, Any]]:
    """The admission chart pulled and rendered as gardener-operator renders it into the virtual
    garden (pkg/operator/controller/extension/extension/admission): the release named after the
    Extension, in namespace extension-<name>, with the operator's values."""
    rendered = gardener_types.render_chart(
        pulled(artifact),
        release_name="dwd-lease",
        namespace="extension-dwd-lease",
        kube_version=binaries.KUBE_APISERVER.version(),
        values=OPERATOR_VALUES,
    )
    return rendered.objects()


def _door(admin: Client, objects: list[dict[str, Any]]) -> None:
    """The door's policy and binding, in force once a bad config is refused."""
    for doc in objects:
        admin.ensure(POLICIES if doc["kind"] == "ValidatingAdmissionPolicy" else BINDINGS, doc)
    bad = garden.shoot("probe", extensions({**GOOD, "failureFraction": 2}))
    wait_for(lambda: refusal(admin, bad) != "", 30, "the door in force")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both charts' artifacts, as `make image` builds them."""
    return charts.build(tmp_path_factory.mktemp("charts"))


@pytest.fixture(scope="module")
def door_objects(artifacts: dict[str, Path]) -> list[dict[str, Any]]:
    return door_as_the_operator_installs_it(artifacts["dwd-lease-admission"])


@pytest.fixture(scope="module")
def admin(door_objects: list[dict[str, Any]]) -> Iterator[Client]:
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
            _door(client, door_objects)
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


def test_an_unchanged_config_is_never_refused(admin: Client, door_objects: list[dict[str, Any]]) -> None:
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
    _door(admin, door_objects)
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


def test_the_operator_installs_the_door_the_aggregator_makes(door_objects: list[dict[str, Any]]) -> None:
    """What gardener-operator renders from the admission chart's artifact is the door, as the
    aggregator's rules write it (and the fixture put it in force in the garden above)."""
    made = [d for d in yaml.safe_load_all((ROOT / door.TARGET).read_text()) if d]
    assert door_objects == made


def test_the_operator_extension_is_the_operators_to_accept(admin: Client, artifacts: dict[str, Path]) -> None:
    """manifests/gardener/operator/extension.yaml: decoded strictly and judged by the operator's
    own validation (a planted fault shows the judge is live), stored through its CRD on a real
    kube-apiserver (which refuses a field of the wrong type), and the seed part's chart it names
    pulled from its artifact as gardenlet's ControllerDeployment carries it."""
    (ext,) = [d for d in yaml.safe_load_all(OPERATOR_EXTENSION.read_text()) if d]
    planted = json.loads(json.dumps(ext))
    planted["spec"]["deployment"]["extension"]["helm"]["ociRepository"]["tag"] = "latest"
    verdicts = gardener_types.strict_errors([ext, planted])
    print(f"the operator's validation of the planted fault: {verdicts[1]}")
    assert verdicts[0] == "" and "ociRepository.tag" in verdicts[1]

    for crd in module_crds("OperatorExtension"):
        admin.ensure(CRDS, crd)
    wrong = json.loads(json.dumps(ext))
    wrong["metadata"]["name"] = "wrong"
    wrong["spec"]["resources"][0]["workerlessSupported"] = "no"
    wait_for(lambda: _stored(admin, ext), 30, "the operator's Extension CRD served")
    with pytest.raises(Invalid) as refused:
        admin.create(OPERATOR_EXTENSIONS, wrong)
    print(f"a field of the wrong type, refused by the CRD: {refused.value}")
    assert "workerlessSupported" in str(refused.value)

    archive = pulled(artifacts["dwd-lease-extension"])
    (deployment, _) = [d for d in yaml.safe_load_all(REGISTRATION.read_text()) if d]
    assert registration.archive_files(base64.b64encode(archive).decode()) == registration.archive_files(
        deployment["helm"]["rawChart"]
    )


def _stored(admin: Client, ext: dict[str, Any]) -> bool:
    try:
        admin.create(OPERATOR_EXTENSIONS, ext)
    except NotFound:
        return False
    return bool(admin.get(f"{OPERATOR_EXTENSIONS}/{ext['metadata']['name']}")["spec"] == ext["spec"])
