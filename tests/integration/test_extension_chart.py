"""The extension as Gardener installs it (manifests/gardener/extension): its ControllerRegistration
and ControllerDeployment decoded by Gardener's types; the chart the ControllerDeployment carries
rendered by gardenlet's renderer with the values gardenlet mixes in, every object decoded by the
seed's types and applied to a real seed kube-apiserver into a namespace labelled as gardenlet
labels it; then the aggregator run as the rendered Deployment runs it (its command and env, its
ServiceAccount's token): it answers an Extension as gardenlet asks for one, and gardenlet's own
check counts it ready. No kubelet runs pods here: the process stands in for the pod."""

from __future__ import annotations

import base64
import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.extension import monitoring
from aggregator.extension.contract import FINALIZER, OPERATION
from aggregator.extension.delivery import OBJECTS_KEY, OBJECTS_SECRET, managed_resource_path
from aggregator.extension.health import HEARTBEAT
from testenv.base import binaries
from testenv.base.kapi import Client, denial
from testenv.base.wait import wait_for
from testenv.gardener import gardener_types, grm
from testenv.gardener.apply import RESOURCES, apply, kustomize_build, load_docs
from testenv.gardener.gardener_types import GardenletValues, ImageQuestion, RenderedChart
from testenv.gardener.registration import CHART, TARGET
from testenv.gardener.seed_objects import cluster, extension, module_crds
from testenv.kube.controlplane import ControlPlane, ensure_namespace, free_port, kubeconfig_yaml
from testenv.worlds.agents import pod_env
from testenv.worlds.aggregators import FromSource, start_aggregator

pytestmark = [
    pytest.mark.integration,
    pytest.mark.builds(grm.NAME),
    pytest.mark.usefixtures("gardener_checker"),
]

ROOT = Path(__file__).resolve().parents[2]
# gardenlet's namespace for a ControllerInstallation: extension-<its name>.
NAMESPACE = "extension-dwd-lease-k7x2p"
SHOOT_NS = "shoot--p--s"
SEED = {
    "apiVersion": "core.gardener.cloud/v1beta1",
    "kind": "Seed",
    "metadata": {"name": "seed-a"},
    "spec": {
        "provider": {"type": "local", "region": "local"},
        "networks": {"pods": "10.1.0.0/16", "services": "10.2.0.0/16"},
    },
    "status": {"clusterIdentity": "seed-a-identity"},
}


def registration() -> dict[str, dict[str, Any]]:
    """The checked-in registration's objects by kind (tests/integration/test_gardener_manifests.py
    checks it holds the chart as it is)."""
    return {d["kind"]: d for d in load_docs((ROOT / TARGET).read_text())}


def render(values: dict[str, Any] | None = None) -> RenderedChart:
    """The registration's chart as gardenlet renders it into NAMESPACE: the ControllerDeployment's
    values, ``values`` over them (as an operator's would be), and gardenlet's own."""
    docs = registration()
    helm = docs["ControllerDeployment"]["helm"]
    return gardener_types.render_chart(
        base64.b64decode(helm["rawChart"]),
        release_name=docs["ControllerRegistration"]["metadata"]["name"],
        namespace=NAMESPACE,
        kube_version=binaries.KUBE_APISERVER.version(),
        values={**helm["values"], **(values or {})},
        gardenlet=GardenletValues(SEED),
    )


def by_kind(objects: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and (not name or o["metadata"]["name"] == name))


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = by_kind(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(only)


@pytest.fixture(scope="module")
def rendered() -> RenderedChart:
    return render()


def test_the_registration_is_what_gardener_decodes() -> None:
    docs = registration()
    assert gardener_types.strict_errors(list(docs.values())) == ["", ""]
    spec = docs["ControllerRegistration"]["spec"]
    (resource,) = spec["resources"]
    values = yaml.safe_load((ROOT / "manifests/gardener/extension/chart/values.yaml").read_text())
    assert (resource["kind"], resource["type"]) == ("Extension", values["extensionType"])
    assert resource["autoEnable"] == ["shoot"] and resource["workerlessSupported"] is False
    assert spec["deployment"]["deploymentRefs"] == [
        {"name": docs["ControllerDeployment"]["metadata"]["name"]}
    ]


def test_every_rendered_object_is_what_the_seeds_types_decode(rendered: RenderedChart) -> None:
    objects = rendered.objects()
    kinds = sorted(o["kind"] for o in objects)
    print(f"\n{len(objects)} objects: {', '.join(kinds)}")
    assert gardener_types.strict_errors(objects) == [""] * len(objects)
    # Only the dashboard goes elsewhere: the seed's Plutono reads the garden namespace's.
    elsewhere = {
        (o["kind"], o["metadata"]["namespace"])
        for o in objects
        if o["metadata"].get("namespace", NAMESPACE) != NAMESPACE
    }
    assert elsewhere == {("ConfigMap", "garden")}
    env = container(objects)["env"]
    # gardenlet's own mutation of what it renders: the seed's name in every container.
    assert {"name": "SEED_NAME", "value": "seed-a"} in env
    assert {"name": "DWD_TARGETS", "value": "extension"} in env


def test_gardens_monitoring_picks_up_what_the_chart_ships(rendered: RenderedChart) -> None:
    """Each object with what Gardener's monitoring selects it by (docs/extensions/
    logging-and-monitoring.md in v1.149.3): the pods scraped by the seed's Prometheus through
    their annotations, on the port the aggregator serves its metrics on; the alerting rules
    (promtool-tested in tests/unit/test_alerts.py) labelled for the seed's Prometheus; the
    dashboard labelled for the seed's Plutono, in the garden namespace."""
    objects = rendered.objects()
    pod = by_kind(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    metrics = next(e["value"] for e in container(objects)["env"] if e["name"] == "DWD_METRICS_ADDR")
    assert (pod["prometheus.io/scrape"], pod["prometheus.io/port"]) == ("true", metrics.rsplit(":", 1)[1])
    rule = by_kind(objects, "PrometheusRule")
    shipped = yaml.safe_load((ROOT / "manifests/monitoring/prometheusrule.yaml").read_text())
    assert rule["metadata"]["labels"]["prometheus"] == "seed" and rule["spec"] == shipped["spec"]
    (dashboard,) = (o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["namespace"] == "garden")
    assert dashboard["metadata"]["labels"]["dashboard.monitoring.gardener.cloud/seed"] == "true"
    (board,) = dashboard["data"].values()
    assert json.loads(board) == json.loads((ROOT / "manifests/monitoring/dashboard.json").read_text())
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    print(
        f"\nseed Prometheus: pods scraped on :{pod['prometheus.io/port']}, {len(alerts)} alerts "
        f"(prometheus: seed); seed Plutono: {dashboard['metadata']['name']} in garden"
    )


def test_a_misspelt_field_in_a_rendered_object_is_found(rendered: RenderedChart) -> None:
    """The check above decodes Kubernetes' kinds too, not only Gardener's: it can fail."""
    pdb = by_kind(rendered.objects(), "PodDisruptionBudget")
    pdb["spec"]["unhealthyPodEvictionPolicyy"] = pdb["spec"].pop("unhealthyPodEvictionPolicy")
    (error,) = gardener_types.strict_errors([pdb])
    assert "unhealthyPodEvictionPolicyy" in error, error


def test_the_chart_grants_and_confines_what_manifests_seed_does(rendered: RenderedChart) -> None:
    """The chart's RBAC and admission policy are manifests/seed's (which the other tests run the
    aggregator under), for its own ServiceAccount: a rule changed there and not here fails."""
    objects, base = rendered.objects(), kustomize_build(ROOT / "manifests" / "seed")
    ours = by_kind(objects, "ClusterRole")["rules"]
    assert all(rule in ours for rule in by_kind(base, "ClusterRole")["rules"])
    extensions = [
        r
        for r in ours
        if r["apiGroups"] == ["extensions.gardener.cloud"] and "clusters" not in r["resources"]
    ]
    assert extensions == [
        {
            "apiGroups": ["extensions.gardener.cloud"],
            "resources": ["extensions"],
            "verbs": ["list", "watch", "patch"],
        },
        {"apiGroups": ["extensions.gardener.cloud"], "resources": ["extensions/status"], "verbs": ["patch"]},
    ]
    heartbeat = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [HEARTBEAT],
        "verbs": ["patch"],
    }
    assert by_kind(objects, "Role")["rules"] == [*by_kind(base, "Role")["rules"], heartbeat]
    policy = by_kind(objects, "ValidatingAdmissionPolicy", "gardener-extension-dwd-lease-seed-writes")["spec"]
    expected = by_kind(base, "ValidatingAdmissionPolicy")["spec"]
    user = f"system:serviceaccount:{NAMESPACE}:dwd-lease-aggregator"
    assert policy["matchConditions"] == [
        {"name": "is-the-aggregator", "expression": f"request.userInfo.username == '{user}'"}
    ]
    # Whitespace aside: kustomize keeps a blank line in a folded scalar where Helm's YAML does not.
    assert _words({**policy, "matchConditions": []}) == _words({**expected, "matchConditions": []})


def _words(value: Any) -> Any:
    """``value`` with each string's whitespace collapsed."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return {k: _words(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_words(v) for v in value]
    return value


MIRROR = "mirror.example/dwd/dwd-lease-aggregator"
DIGEST = "sha256:" + "ab" * 32
# Overwrites of the aggregator's image, each resolved by the chart and by Gardener's image vector.
OVERWRITES = [
    "",
    "images: []\n",
    f"images:\n- name: dwd-lease-aggregator\n  repository: {MIRROR}\n  tag: 0.3.0\n",
    f"images:\n- name: dwd-lease-aggregator\n  repository: {MIRROR}\n  tag: {DIGEST}\n",
    f"images:\n- name: dwd-lease-aggregator\n  repository: {MIRROR}\n",
    f"images:\n- name: dwd-lease-aggregator\n  ref: {MIRROR}:0.3.1\n",
    f"images:\n- name: dwd-lease-agent\n  ref: {MIRROR}:other\n",
    # Merged in order: the second keeps the first's tag, a ref drops both.
    f"images:\n- name: dwd-lease-aggregator\n  repository: a.example/x\n  tag: v1\n"
    f"- name: dwd-lease-aggregator\n  repository: {MIRROR}\n",
    f"images:\n- name: dwd-lease-aggregator\n  repository: a.example/x\n  tag: v1\n"
    f"- name: dwd-lease-aggregator\n  ref: {MIRROR}:v2\n",
]


def test_the_image_is_what_gardeners_image_vector_makes_of_the_overwrite() -> None:
    default = registration()["ControllerDeployment"]["helm"]["values"]["image"]
    gardener = gardener_types.find_images(
        [ImageQuestion("dwd-lease-aggregator", default, overwrite) for overwrite in OVERWRITES]
    )
    ours = [container(render({"imageVectorOverwrite": o}).objects())["image"] for o in OVERWRITES]
    for overwrite, theirs, image in zip(OVERWRITES, gardener, ours, strict=True):
        print(f"{overwrite!r}: {image}")
        assert image == theirs, f"{overwrite!r}: the chart says {image}, Gardener {theirs}"
    assert len(set(ours)) >= 6, ours  # the cases differ: a chart ignoring the overwrite fails


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"settings": {"DWD_TARGETS": "gardener"}}, "settings.DWD_TARGETS: set by the chart"),
        ({"settings": {"LOG_LEVEL": "debug"}}, "settings.LOG_LEVEL: the aggregator's settings are DWD_"),
        (
            {"imageVectorOverwrite": "images:\n- name: dwd-lease-aggregator\n  tag: v1\n"},
            "images[0] (dwd-lease-aggregator): either ref or repository is required",
        ),
        (
            {
                "imageVectorOverwrite": f"images:\n- name: dwd-lease-aggregator\n  ref: {MIRROR}:v1\n"
                "  targetVersion: '>= 1.30'\n"
            },
            "targetVersion is not supported",
        ),
    ],
)
def test_values_the_chart_cannot_honour_fail_the_rendering(values: dict[str, Any], says: str) -> None:
    """gardenlet reports a chart that does not render on the ControllerInstallation
    (ChartCannotBeRendered) instead of installing something else than was asked."""
    with pytest.raises(RuntimeError, match=re.escape(says)):
        render(values)


def test_settings_reach_the_aggregator_as_its_variables() -> None:
    env = pod_env(
        container(render({"settings": {"DWD_SHARDS": 4}, "dryRun": False}).objects()), namespace=NAMESPACE
    )
    assert (env["DWD_SHARDS"], env["DWD_DRY_RUN"], env["DWD_LOG_FORMAT"]) == ("4", "false", "json")


@pytest.fixture(scope="module")
def seed() -> Iterator[ControlPlane]:
    """A seed of this module's own: the release's CRDs must not replace the schemaless ones
    other modules install in the session's seed."""
    with ControlPlane().running() as cp:
        yield cp


def _served(admin: Client) -> bool:
    try:
        for path in (
            "/apis/extensions.gardener.cloud/v1alpha1/extensions",
            "/apis/extensions.gardener.cloud/v1alpha1/clusters",
            "/apis/autoscaling.k8s.io/v1/verticalpodautoscalers",
            "/apis/monitoring.coreos.com/v1/prometheusrules",
        ):
            admin.get(path)
    except Exception:
        return False
    return True


def installation_namespace() -> dict[str, Any]:
    """The namespace as gardenlet makes it for the installation, with the pod security level
    it enforces there also warned of: a Deployment whose pods it would refuse fails apply."""
    meta = registration()["ControllerRegistration"]["metadata"]
    level = meta["annotations"]["security.gardener.cloud/pod-security-enforce"]
    labels = {
        "gardener.cloud/role": "extension",
        "controllerregistration.core.gardener.cloud/name": meta["name"],
        "high-availability-config.resources.gardener.cloud/consider": "true",
        "pod-security.kubernetes.io/enforce": level,
        "pod-security.kubernetes.io/warn": level,
    }
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}


def test_installed_in_a_seed_the_controller_answers_an_extension(
    seed: ControlPlane, rendered: RenderedChart, tmp_path: Path
) -> None:
    for kind, plural, namespaced in (
        ("Cluster", "clusters", False),
        ("Extension", "extensions", True),
        ("VerticalPodAutoscaler", "verticalpodautoscalers", True),
        ("ManagedResource", "managedresources", True),
        ("PrometheusRule", "prometheusrules", True),
    ):
        RESOURCES.setdefault(kind, (plural, namespaced))
    objects = rendered.objects()
    with seed.admin_client() as admin:
        crds = (
            "Cluster",
            "Extension",
            "VerticalPodAutoscaler",
            "ManagedResource",
            "PrometheusRule",
            "ServiceMonitor",
        )
        apply(admin, module_crds(*crds))
        wait_for(lambda: _served(admin), 30, "the CRDs")
        apply(admin, [installation_namespace()])
        ensure_namespace(admin, "garden")  # every seed has it: its monitoring lives there
        apply(admin, objects)  # raises ApplyWarning on any warning: pod security's included
        ensure_namespace(admin, SHOOT_NS)
        apply(admin, [cluster(SHOOT_NS), extension(SHOOT_NS), extension(SHOOT_NS, type_="other")])
        token = admin.create(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/dwd-lease-aggregator/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
    with seed.token_client(token) as aggregator:
        _confined(aggregator)
    ours = f"/apis/extensions.gardener.cloud/v1alpha1/namespaces/{SHOOT_NS}/extensions/dwd-lease"

    kubeconfig = tmp_path / "in-cluster.kubeconfig"
    kubeconfig.write_text(kubeconfig_yaml(seed.url, seed.ca_file, {"token": token}))
    process = start_aggregator(
        _env(objects, kubeconfig, tmp_path),
        name="aggregator",
        log_path=tmp_path / "agg.log",
        run=FromSource(_module(container(objects))),
    )
    try:
        with seed.admin_client() as admin:
            answered = wait_for(
                lambda: _answered(admin.get(ours)), 30, f"the Extension answered (log: {process.log_path})"
            )
            lease = admin.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/dwd-lease-aggregator"
            )
            delivered = admin.get(managed_resource_path(SHOOT_NS))
            alerts = [admin.get(path) for path in monitoring.paths(SHOOT_NS)]
            objects_secret = admin.get(f"/api/v1/namespaces/{SHOOT_NS}/secrets/{OBJECTS_SECRET}")
            beat = admin.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{HEARTBEAT}")
    finally:
        process.kill()
    # The shoot part delivered under the chart's RBAC and policy, the agents' image the chart's.
    assert delivered["spec"]["secretRefs"] == [{"name": OBJECTS_SECRET}]
    # The shoot's own alerts beside it, under the same RBAC and policy, as Gardener's types read them.
    assert [a["kind"] for a in alerts] == ["ServiceMonitor", "PrometheusRule"]
    assert gardener_types.strict_errors(alerts) == ["", ""]
    assert alerts[0]["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    shipped = yaml.safe_load_all(base64.b64decode(objects_secret["data"][OBJECTS_KEY]))
    (agents,) = (d for d in shipped if d and d["kind"] == "DaemonSet")
    values = yaml.safe_load((ROOT / CHART / "values.yaml").read_text())
    assert {c["image"] for c in agents["spec"]["template"]["spec"]["containers"]} == {values["agentImage"]}
    assert beat["spec"]["holderIdentity"] == "dwd-lease"
    assert answered["metadata"]["finalizers"] == [FINALIZER]
    assert gardener_types.strict_errors([answered]) == [""]
    assert gardener_types.extension_verdicts([answered]) == [""]  # ready, by gardenlet's own function
    assert lease["spec"]["holderIdentity"], lease  # elected under the chart's Role
    events = process.events()
    names = [e["event"] for e in events]
    # The Extension turned its shoot on (whose shoot is not there: no agents here), and nothing
    # the aggregator did in the seed under the chart's RBAC was refused.
    assert {"extension_reconciled", "target_started"} <= set(names), names
    assert not [e for e in events if "forbidden" in json.dumps(e).lower()], events


def _module(c: dict[str, Any]) -> str:
    """The module the container's command runs: our console script's (pyproject.toml)."""
    (command,) = c["command"]
    assert not c.get("args")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = str(scripts[command]).split(":")
    assert (module, function) == ("aggregator.__main__", "main")
    return module.removesuffix(".__main__")


def _env(objects: list[dict[str, Any]], kubeconfig: Path, tmp: Path) -> dict[str, str]:
    """The container's env as kubelet gives it in NAMESPACE, and stand-ins for the pod: the
    token's kubeconfig for the in-cluster mount, a free local port for :8080 (taken here), and
    each ConfigMap it mounts written under ``tmp``, the paths that name a mount moved there."""
    c = container(objects)
    env = pod_env(c, namespace=NAMESPACE)
    assert env["DWD_METRICS_ADDR"] == ":8080" and "DWD_SEED_KUBECONFIG" not in env
    for mount, local in _config_maps(objects, c, tmp).items():
        env = {k: v.replace(mount, str(local), 1) if v.startswith(mount + "/") else v for k, v in env.items()}
    return {**env, "DWD_SEED_KUBECONFIG": str(kubeconfig), "DWD_METRICS_ADDR": f"127.0.0.1:{free_port()}"}


def _config_maps(objects: list[dict[str, Any]], c: dict[str, Any], tmp: Path) -> dict[str, Path]:
    """Each ConfigMap volume of the container, its data written as kubelet mounts it: mount path
    to the local directory."""
    volumes = {v["name"]: v for v in by_kind(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    out = {}
    for mount in c.get("volumeMounts") or []:
        source = volumes[mount["name"]].get("configMap")
        if source is None:
            continue
        local = tmp / mount["name"]
        local.mkdir()
        for key, text in maps[source["name"]]["data"].items():
            (local / key).write_text(text)
        out[mount["mountPath"]] = local
    return out


def _answered(obj: dict[str, Any]) -> dict[str, Any] | None:
    last = (obj.get("status") or {}).get("lastOperation") or {}
    picked_up = OPERATION not in (obj["metadata"].get("annotations") or {})
    return obj if picked_up and last.get("state") == "Succeeded" else None


def _confined(aggregator: Client) -> None:
    """The chart's policy holds before the aggregator starts: with its token, another type's
    Extension and our Extension's spec are refused by the policy (RBAC allows both)."""
    base = f"/apis/extensions.gardener.cloud/v1alpha1/namespaces/{SHOOT_NS}/extensions"
    other = wait_for(
        lambda: denial(lambda: aggregator.merge_patch(f"{base}/other", {"metadata": {"finalizers": ["x"]}})),
        20,
        "the policy to refuse another type's Extension",
    )
    assert "writes only Extensions of type dwd-lease, not shoot--p--s/other" in other, other
    spec = denial(lambda: aggregator.merge_patch(f"{base}/dwd-lease", {"spec": {"providerConfig": {"a": 1}}}))
    assert "only its finalizer (every finalizer on a migration), the operation annotation (off)" in spec, spec
