"""gardenlet's own code run on our objects, through our checker built from Gardener's release
(testenv/gardener/gardener_types.py): its verdict on an Extension (``health.CheckExtensionObject``, one
case per condition it checks), what its shoot care makes of our health condition
(``checker.CheckExtensionCondition``), how it reads a force deletion, the extension
registration kinds decoded strictly, and a chart
rendered by its ``chartrenderer`` with the values gardenlet mixes in, then applied to a real
kube-apiserver."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from aggregator.extension.health import Health, heartbeat
from aggregator.model.lifecycle import ClusterView
from core.errors import NotFound, TooManyRequests
from image import charts
from testenv.base import binaries
from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.gardener import gardener_types, grm
from testenv.gardener.apply import RESOURCES, apply
from testenv.gardener.seed_objects import (
    OPERATION,
    TIMESTAMP,
    cluster,
    extension,
    extension_status,
    module_crds,
)
from testenv.kube.controlplane import ControlPlane, ensure_namespace
from tests.unit.test_extension_health import CONTRACT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.builds(grm.NAME),
    pytest.mark.usefixtures("gardener_checker"),
]

NS = "shoot--p--s"
UPDATED = "2026-03-01T10:00:00Z"


def _ext(
    *,
    generation: int = 1,
    observed: int = 1,
    state: str | None = "Succeeded",
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """gardenlet's Extension as a controller has answered it: its annotations gone (unless
    ``annotations``), ``generation`` counted, ``state`` written at UPDATED (None: nothing yet)."""
    obj = extension(NS)
    obj["metadata"].update(generation=generation, annotations=dict(annotations or {}))
    answered = (
        extension_status(state, UPDATED, observed_generation=observed)
        if state is not None
        else {"observedGeneration": observed}
    )
    return {**obj, "status": {**answered, **(status or {})}}


# Each condition gardenlet checks, and what its verdict says (pkg/utils/kubernetes/health/extensions.go).
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("reconciled", _ext(), ""),
    ("reconciled, asked at the same second", _ext(annotations={TIMESTAMP: "2026-03-01T10:00:00.9Z"}), ""),
    (
        "a lastError",
        _ext(status={"lastError": {"description": "providerConfig.failureFraction: 2 > 1"}}),
        "error during reconciliation: providerConfig.failureFraction: 2 > 1",
    ),
    ("a spec change not yet observed", _ext(generation=2), "observed generation outdated (1/2)"),
    (
        "the operation annotation still there",
        _ext(annotations={OPERATION: "reconcile"}),
        'gardener operation "reconcile" is not yet picked up by controller',
    ),
    ("no lastOperation yet", _ext(state=None), "extension did not record a last operation yet"),
    ("still processing", _ext(state="Processing"), "extension state is not succeeded but Processing"),
    ("failed", _ext(state="Error"), "extension state is not succeeded but Error"),
    (
        "asked again after its last update",
        _ext(annotations={TIMESTAMP: "2026-03-01T10:00:01Z"}),
        "extension is not reconciled yet - reconciliation requested at 2026-03-01T10:00:01Z",
    ),
]


def test_gardenlet_judges_an_extension_by_each_of_its_conditions() -> None:
    verdicts = gardener_types.extension_verdicts([obj for _, obj, _ in CASES])
    for (why, _, expected), verdict in zip(CASES, verdicts, strict=True):
        print(f"{why}: {verdict or 'ready'}")
        assert (verdict == "") if not expected else verdict.startswith(expected), f"{why}: {verdict!r}"


def test_an_object_that_is_not_an_extension_gets_no_verdict() -> None:
    misspelt = _ext()
    misspelt["status"]["observedgeneration"] = misspelt["status"].pop("observedGeneration")
    with pytest.raises(RuntimeError, match=r"object 1: .*status\.observedgeneration"):
        gardener_types.extension_verdicts([_ext(), misspelt])


# Go's strconv.ParseBool's spellings and some it refuses (read as false by Gardener).
FORCE_VALUES = ["true", "True", "TRUE", "1", "t", "T", "false", "0", "f", "yes", "on", "y", " true", "", None]


def test_force_deletion_is_read_as_gardener_reads_it() -> None:
    clusters = [cluster(NS, deleting=True, force_deletion=v) for v in FORCE_VALUES]
    gardeners = gardener_types.force_deletions(clusters)
    ours = [ClusterView.from_object(c).force_deletion for c in clusters]
    print("force deletion:", dict(zip(map(repr, FORCE_VALUES), gardeners, strict=True)))
    assert ours == gardeners and any(gardeners) and not all(gardeners)


def _reported(said: Health, beat_age_s: float | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """An Extension carrying ``said`` as the reconciler writes it, and its controller's heartbeat
    Lease as it renews it, ``beat_age_s`` ago (None: no heartbeat)."""
    now = datetime.now(UTC)
    obj = _ext()
    obj["status"]["conditions"] = [said.condition(now.strftime("%Y-%m-%dT%H:%M:%SZ"), None)]
    if beat_age_s is None:
        return obj, None
    renewed = (now - timedelta(seconds=beat_age_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return obj, heartbeat(NS, "dwd-lease", 30, renewed)


def test_gardenlet_reads_our_condition_into_the_shoots_as_we_mean_it() -> None:
    """Each state of the condition contract (tests/unit/test_extension_health.py ``CONTRACT``)
    read by gardenlet's shoot care with the heartbeat beside it: only a broken protection turns
    the Shoot's condition False; protection on, acting, too small to judge, in dry run, opted out
    or hibernated leaves it to its other checks; and a controller whose heartbeat stopped has its
    report read as outdated."""
    said = [(state, h, expected) for state, h, _, expected in CONTRACT if h is not None]
    cases = [
        *[(state, h, 10.0, expected) for state, h, expected in said],
        ("heartbeat stopped", said[0][1], 600.0, "Unknown"),
        ("no heartbeat", said[0][1], None, "Unknown"),
    ]
    answers = gardener_types.shoot_conditions([_reported(h, age) for _, h, age, _ in cases])
    for (why, h, _, expected), (status, reason, message) in zip(cases, answers, strict=True):
        shoots = f"{status} {reason}" if status else "(left to its other checks)"
        print(f"{why}: ours {h.status} {h.reason}; the Shoot's: {shoots}")
        assert status == expected, f"{why}: {status} {reason}: {message}"
        if status == "False":
            assert message.endswith(h.message), message


def _registration(**resource: Any) -> dict[str, Any]:
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "ControllerRegistration",
        "metadata": {"name": "dwd-lease"},
        "spec": {
            "resources": [
                {
                    "kind": "Extension",
                    "type": "dwd-lease",
                    "lifecycle": {"reconcile": "AfterKubeAPIServer"},
                    **resource,
                }
            ],
            "deployment": {"deploymentRefs": [{"name": "dwd-lease"}]},
        },
    }


def _deployment(api_version: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "ControllerDeployment",
        "metadata": {"name": "dwd-lease"},
        **body,
    }


RAW_CHART = base64.b64encode(b"not read by the decoder").decode()


def test_the_registration_kinds_decode_strictly_in_the_versions_gardener_serves() -> None:
    good = [
        _registration(autoEnable=["shoot"], workerlessSupported=True),
        _deployment("core.gardener.cloud/v1", {"helm": {"rawChart": RAW_CHART, "values": {"replicas": 1}}}),
        _deployment("core.gardener.cloud/v1beta1", {"type": "helm", "providerConfig": {"chart": RAW_CHART}}),
        _ext(),
    ]
    assert gardener_types.strict_errors(good) == ["", "", "", ""]
    planted = [
        (_registration(autoEnable="shoot"), "autoEnable"),  # a list in Gardener's type
        (_registration(workerless=True), "workerless"),
        (_deployment("core.gardener.cloud/v1", {"helm": {"rawchart": RAW_CHART}}), "helm.rawchart"),
        (_deployment("core.gardener.cloud/v1", {"type": "helm"}), "type"),  # v1beta1's shape in v1
    ]
    errors = gardener_types.strict_errors([obj for obj, _ in planted])
    for (_, name), error in zip(planted, errors, strict=True):
        assert name in error, f"{error!r} should name {name}"
        print(f"{name}: {error}")


TEMPLATE = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "name" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    seed: {{ .Values.gardener.seed.name }}
    gardener-version: {{ .Values.gardener.version }}
    kube-minor: {{ .Capabilities.KubeVersion.Minor | quote }}
spec:
  replicas: {{ .Values.replicas }}
  selector: {matchLabels: {app: {{ include "name" . }}}}
  template:
    metadata: {labels: {app: {{ include "name" . }}}}
    spec:
      containers:
      - name: c
        image: {{ .Values.image }}
"""


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    root = tmp_path / "dwd-lease"
    (root / "templates").mkdir(parents=True)
    (root / "Chart.yaml").write_text("apiVersion: v2\nname: dwd-lease\nversion: 0.1.0\n")
    (root / "values.yaml").write_text("replicas: 1\nimage: example.org/dwd-lease:v0\n")
    (root / "templates" / "_helpers.tpl").write_text(
        '{{- define "name" -}}{{ .Release.Name }}-ctl{{- end -}}\n'
    )
    (root / "templates" / "deployment.yaml").write_text(TEMPLATE)
    (root / "templates" / "NOTES.txt").write_text("installed\n")
    return root


SEED = {
    "apiVersion": "core.gardener.cloud/v1beta1",
    "kind": "Seed",
    "metadata": {"name": "seed-a", "labels": {"region": "local"}},
    "spec": {
        "provider": {"type": "local", "region": "local"},
        "networks": {"pods": "10.1.0.0/16", "services": "10.2.0.0/16"},
        "ingress": {"domain": "ingress.seed-a.example.org", "controller": {"kind": "nginx"}},
    },
    "status": {"clusterIdentity": "seed-a-identity"},
}


@pytest.fixture(scope="module")
def own_seed() -> Iterator[ControlPlane]:
    """A seed of this module's own: the release's Extension CRD must not replace the one
    another module installs in the session's seed."""
    with ControlPlane().running() as cp:
        yield cp


def test_a_chart_renders_as_gardenlet_renders_it_and_applies(chart: Path, own_seed: ControlPlane) -> None:
    namespace = "extension-dwd-lease-x1y2z"
    rendered = gardener_types.render_chart(
        charts.archive(chart),
        release_name="dwd-lease",
        namespace=namespace,
        kube_version=binaries.KUBE_APISERVER.version(),
        values={"replicas": 2},
        gardenlet=gardener_types.GardenletValues(SEED),
    )
    print(f"\nfiles: {sorted(rendered.files)}")
    assert sorted(rendered.files) == ["dwd-lease_templates_deployment.yaml"]  # no NOTES, no partials
    (deployment,) = rendered.objects()
    labels = deployment["metadata"]["labels"]
    assert (deployment["metadata"]["name"], deployment["metadata"]["namespace"]) == (
        "dwd-lease-ctl",
        namespace,
    )
    assert labels == {"seed": "seed-a", "gardener-version": grm.VERSION, "kube-minor": "35"}
    assert (
        deployment["spec"]["replicas"],
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
    ) == (
        2,
        "example.org/dwd-lease:v0",
    )
    gardener = rendered.values["gardener"]
    assert gardener["seed"]["ingressDomain"] == "ingress.seed-a.example.org"
    assert gardener["seed"]["clusterIdentity"] == "seed-a-identity"
    gates = gardener["gardenlet"]["featureGates"]
    assert gates and all(isinstance(v, bool) for v in gates.values()), gates
    with own_seed.admin_client() as admin:
        ensure_namespace(admin, namespace)
        applied = apply(admin, rendered.objects())
    assert applied[0]["metadata"]["uid"]


def test_gardenlet_refuses_a_seed_without_its_cluster_identity(chart: Path) -> None:
    seed = {**SEED, "status": {}}
    with pytest.raises(RuntimeError, match=r"status\.clusterIdentity not set"):
        gardener_types.render_chart(
            charts.archive(chart),
            release_name="dwd-lease",
            namespace="extension-x",
            kube_version=binaries.KUBE_APISERVER.version(),
            gardenlet=gardener_types.GardenletValues(seed),
        )


EXTENSIONS = f"/apis/extensions.gardener.cloud/v1alpha1/namespaces/{NS}/extensions"


def _served(admin: Client, path: str) -> bool:
    try:
        admin.get(path)
    except (NotFound, TooManyRequests):  # 429: a new CRD's storage is still initialising
        return False
    return True


def test_an_extension_under_gardeners_crd_is_judged_as_the_server_stores_it(own_seed: ControlPlane) -> None:
    """gardenlet's request, then a controller's answer, each read back from a kube-apiserver
    serving the release's own Extension CRD: its schema drops what Gardener's type has not."""
    RESOURCES.setdefault("Extension", ("extensions", True))
    asked = extension(NS, timestamp="2026-03-01T10:00:00.5Z")
    with own_seed.admin_client() as admin:
        apply(admin, module_crds("Extension"))
        wait_for(lambda: _served(admin, EXTENSIONS), 30, "the Extension CRD")
        ensure_namespace(admin, NS)
        stored = admin.create(EXTENSIONS, asked)
        path = f"{EXTENSIONS}/dwd-lease"
        status = {
            **extension_status("Succeeded", UPDATED, observed_generation=stored["metadata"]["generation"]),
            "healthy": True,  # no such field in Gardener's type
        }
        admin.merge_patch(f"{path}/status", {"status": status})
        answered = admin.get(path)
        admin.merge_patch(path, {"metadata": {"annotations": {OPERATION: None}}})
        done = admin.get(path)
    verdicts = gardener_types.extension_verdicts([stored, answered, done])
    # gardenlet checks the generation before the annotation: a new object is not yet observed.
    assert verdicts[:2] == [
        "observed generation outdated (0/1)",
        'gardener operation "reconcile" is not yet picked up by controller',
    ]
    assert "healthy" not in answered["status"], answered["status"]
    assert verdicts[2] == "", done
