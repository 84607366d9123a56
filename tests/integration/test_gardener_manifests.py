"""manifests/gardener and manifests/monitoring rendered by kustomize and applied to a real API
server (Gardener's kinds under the CRDs of its release): the seed component labelled as gardenlet's are,
the shoot part as a ManagedResource whose objects are what their kustomization renders, and
the agent under kubelet's own priority level once those objects are applied."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.lease import lease_metadata, leases_path, node_lease_path
from testenv.base.kapi import Client, denial, unless_forbidden
from testenv.base.wait import wait_for
from testenv.gardener import grm
from testenv.gardener.apply import (
    GENERATED,
    RESOURCES,
    apply,
    generated,
    generated_contents,
    kustomize_build,
    load_docs,
)
from testenv.gardener.seed_objects import module_crds
from testenv.kube.controlplane import ControlPlane, ensure_namespace, ensure_node
from testenv.worlds.agents import ByUrl, pod_env, start_agent

pytestmark = [pytest.mark.integration, pytest.mark.builds(grm.NAME)]

ROOT = Path(__file__).resolve().parents[2]
SHOOT_NS = "shoot--p--s"
OBJECTS_SECRET = "managedresource-dwd-lease-shoot"  # what the ManagedResource delivers


def by_kind(docs: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and (not name or d["metadata"]["name"] == name))


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    """A control plane of its own: the FlowSchema and the admission policy must not leak."""
    with ControlPlane().running() as cp:
        yield cp


@pytest.fixture(scope="module")
def installed(plane: ControlPlane) -> dict[str, list[dict[str, Any]]]:
    RESOURCES.setdefault("ManagedResource", ("managedresources", True))
    RESOURCES.setdefault("VerticalPodAutoscaler", ("verticalpodautoscalers", True))
    RESOURCES.setdefault("PrometheusRule", ("prometheusrules", True))
    rendered = {
        "seed": kustomize_build(ROOT / "manifests" / "gardener" / "seed"),
        "shoot": [
            {**d, "metadata": {**d["metadata"], "namespace": SHOOT_NS}}
            for d in kustomize_build(ROOT / "manifests" / "gardener" / "shoot")
        ],
    }
    with plane.admin_client() as admin:
        apply(admin, module_crds("ManagedResource", "VerticalPodAutoscaler", "PrometheusRule"))
        wait_for(lambda: _served(admin), 20, "the CRDs")
        for ns in ("garden", "kube-system", SHOOT_NS):
            ensure_namespace(admin, ns)
        for docs in rendered.values():
            apply(admin, docs)  # raises ApplyWarning on any warning
        apply(admin, load_docs((ROOT / "manifests" / "gardener" / "shoot" / "agent-vpa.yaml").read_text()))
    return rendered


def _served(admin: Client) -> bool:
    try:
        for path in (
            "/apis/resources.gardener.cloud/v1alpha1/managedresources",
            "/apis/autoscaling.k8s.io/v1/verticalpodautoscalers",
            "/apis/monitoring.coreos.com/v1/prometheusrules",
        ):
            admin.get(path)
    except Exception:
        return False
    return True


def test_the_generated_manifests_are_what_their_sources_render() -> None:
    """objects.yaml is generated (kustomize cannot nest one build in another's Secret), and the
    extension's registration carries the chart: a change to the agent's or the access's
    manifests, or to the chart, without `make manifests` fails here."""
    for target in GENERATED:
        held = generated_contents(target, (ROOT / target).read_text())
        assert held == generated_contents(target, generated(ROOT, target)), f"{target}: run make manifests"


def test_the_seed_component_is_labelled_as_gardenlets_own(installed: dict[str, list[dict[str, Any]]]) -> None:
    seed = installed["seed"]
    deployment = by_kind(seed, "Deployment")
    template = deployment["spec"]["template"]
    assert (
        deployment["metadata"]["labels"]["high-availability-config.resources.gardener.cloud/type"]
        == "controller"
    )
    assert {
        "networking.gardener.cloud/to-dns": "allowed",
        "networking.gardener.cloud/to-runtime-apiserver": "allowed",
        "networking.resources.gardener.cloud/to-all-shoots-kube-apiserver-tcp-443": "allowed",
    }.items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    spec = template["spec"]
    assert spec["priorityClassName"] == "gardener-system-800"
    assert "affinity" not in spec  # the resource manager's HA webhook spreads it
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "300m", "memory": "192Mi"}}  # no limit
    assert deployment["spec"]["revisionHistoryLimit"] == 2
    vpa = by_kind(seed, "VerticalPodAutoscaler")
    assert vpa["spec"]["targetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "dwd-lease-aggregator",
    }
    assert vpa["spec"]["resourcePolicy"]["containerPolicies"][0]["controlledValues"] == "RequestsOnly"
    assert by_kind(seed, "PodDisruptionBudget")["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    service = by_kind(seed, "Service")
    assert (
        "8080"
        in service["metadata"]["annotations"][
            "networking.resources.gardener.cloud/from-all-seed-scrape-targets-allowed-ports"
        ]
    )
    assert by_kind(seed, "PrometheusRule")["metadata"]["labels"]["prometheus"] == "seed"
    # Its writes confined as everywhere; the seed's label-driven policies, not ours, which would
    # widen them (policies add up).
    assert (
        by_kind(seed, "ValidatingAdmissionPolicy")["metadata"]["name"] == "dwd-lease-aggregator-seed-writes"
    )
    assert not [d for d in seed if d["kind"] == "NetworkPolicy"]


def test_the_shoot_part_is_a_managed_resource_of_gardeners_shape(
    plane: ControlPlane, installed: dict[str, list[dict[str, Any]]]
) -> None:
    shoot = installed["shoot"]
    mr = by_kind(shoot, "ManagedResource")
    secret = by_kind(shoot, "Secret", OBJECTS_SECRET)
    assert "class" not in mr["spec"]  # the shoot's resource manager applies it into the shoot
    assert mr["spec"]["secretRefs"] == [{"name": secret["metadata"]["name"]}]
    # gardenlet's shoot deletion deletes this origin's ManagedResources, then waits for all.
    assert mr["metadata"]["labels"]["origin"] == "gardener"
    objects = load_docs(base64.b64decode(secret["data"]["objects.yaml"]).decode())
    daemonset = by_kind(objects, "DaemonSet")
    assert daemonset["metadata"]["namespace"] == "kube-system"
    assert {"gardener.cloud/role": "system-component", "origin": "dwd-lease"}.items() <= daemonset[
        "metadata"
    ]["labels"].items()
    assert daemonset["spec"]["revisionHistoryLimit"] == 2
    # Its metrics served as shipped: DwdLeaseAgentNotRenewing needs them.
    # On the node's own address, not every interface of the node.
    env = pod_env(daemonset["spec"]["template"]["spec"]["containers"][0], node="n", host_ip="10.250.0.7")
    assert env["DWD_METRICS_ADDR"] == "10.250.0.7:16909"
    assert daemonset["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "16909"
    # Not node-critical: that would keep new nodes tainted while the agent cannot run.
    for labels in (daemonset["metadata"]["labels"], daemonset["spec"]["template"]["metadata"]["labels"]):
        assert "node.gardener.cloud/critical-component" not in labels
    assert daemonset["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    # The same bounded memory as everywhere (the base's limit, over twice its measured size).
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "64Mi"}
    # The agent's VPA is for shoots that run one, apart: in the ManagedResource it would fail
    # the whole of it where the shoot has no VPA CRD.
    assert not [d for d in objects if d["kind"] == "VerticalPodAutoscaler"]
    vpa = load_docs((ROOT / "manifests" / "gardener" / "shoot" / "agent-vpa.yaml").read_text())
    assert vpa[0]["spec"]["targetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "dwd-lease-agent",
    }
    assert not [d for d in objects if d["kind"] == "PriorityLevelConfiguration"]
    assert by_kind(objects, "FlowSchema")["spec"]["priorityLevelConfiguration"]["name"] == "node-high"
    with plane.admin_client() as admin:
        stored = admin.get(
            f"/apis/resources.gardener.cloud/v1alpha1/namespaces/{SHOOT_NS}/managedresources/dwd-lease-shoot"
        )
        assert stored["spec"]["secretRefs"][0]["name"] == secret["metadata"]["name"]


def test_delivered_the_agent_renews_its_own_lease_under_kubelets_priority_level(
    plane: ControlPlane, installed: dict[str, list[dict[str, Any]]]
) -> None:
    """What the resource manager would apply into the shoot, applied here: the agent's
    ServiceAccount is in kube-system now, and its renewals share node-high with kubelet's."""
    secret = by_kind(installed["shoot"], "Secret", OBJECTS_SECRET)
    objects = load_docs(base64.b64decode(secret["data"]["objects.yaml"]).decode())
    with plane.admin_client() as admin:
        apply(admin, objects)
        ensure_node(admin, "node-g")
        admin.ensure(leases_path("kube-system"), {"metadata": lease_metadata("node-g"), "spec": {}})
        token = plane.node_token("node-g", namespace="kube-system", service_account="dwd-lease-agent")
        schema = admin.get("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/dwd-lease-agent")
        level = admin.get("/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/node-high")
    with plane.token_client(token) as agent:
        renewed = wait_for(
            lambda: unless_forbidden(
                lambda: agent.merge_patch(
                    node_lease_path("kube-system", "node-g"), {"spec": {"holderIdentity": "node-g"}}
                )
            ),
            10,
            "RBAC to allow the agent",
        )
        assert renewed["spec"]["holderIdentity"] == "node-g"
        assert agent.last_headers["X-Kubernetes-PF-FlowSchema-UID"] == schema["metadata"]["uid"]
        assert agent.last_headers["X-Kubernetes-PF-PriorityLevel-UID"] == level["metadata"]["uid"]
        with plane.admin_client() as admin:
            admin.ensure(leases_path("kube-system"), {"metadata": lease_metadata("node-h"), "spec": {}})
        denied = wait_for(
            lambda: denial(
                lambda: agent.merge_patch(
                    node_lease_path("kube-system", "node-h"), {"spec": {"holderIdentity": "x"}}
                )
            ),
            10,
            "the admission policy to deny another node's lease",
        )
        assert "may only renew lease dwd-node-lease-node-g, not dwd-node-lease-node-h" in denied


def test_the_delivered_agent_process_renews_on_node_high(
    plane: ControlPlane, installed: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The real agent, with a token of kube-system/dwd-lease-agent bound to its node: its
    renewals land, and the API server dispatches them on node-high by our FlowSchema."""
    secret = by_kind(installed["shoot"], "Secret", OBJECTS_SECRET)
    with plane.admin_client() as admin:
        apply(admin, load_docs(base64.b64decode(secret["data"]["objects.yaml"]).decode()))
        ensure_node(admin, "node-r")
        admin.ensure(leases_path("kube-system"), {"metadata": lease_metadata("node-r"), "spec": {}})
        before = _dispatched(admin)
        token = tmp_path / "token"
        token.write_text(
            plane.node_token("node-r", namespace="kube-system", service_account="dwd-lease-agent")
        )
        env = {"PATH": os.environ.get("PATH", ""), "DWD_RENEW_INTERVAL": "500ms", "DWD_LOG_FORMAT": "json"}
        agent = start_agent(
            "node-r",
            token_file=token,
            server=ByUrl(plane.url, plane.ca_file),
            log_path=tmp_path / "agent.log",
            env=env,
            name="agent",
        )
        try:
            wait_for(
                lambda: (
                    admin.get(node_lease_path("kube-system", "node-r"))["spec"].get("holderIdentity")
                    == "node-r"
                ),
                20,
                "the agent's first renewal",
            )
            wait_for(lambda: _dispatched(admin) >= before + 5, 20, "renewals dispatched on node-high")
        finally:
            agent.kill()


def _dispatched(admin: Client) -> float:
    """Requests the API server dispatched by our FlowSchema on kubelet's priority level."""
    text = admin.http.get("/metrics").text
    wanted = ('flow_schema="dwd-lease-agent"', 'priority_level="node-high"')
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{")
        and all(w in line for w in wanted)
    )


def test_the_aggregators_credentials_are_a_token_requestor_secret(
    plane: ControlPlane, installed: dict[str, list[dict[str, Any]]]
) -> None:
    """The shoot's resource manager fills it: a token of the aggregator's ServiceAccount in the
    shoot and the CA bundle (no kubeconfig key: the aggregator knows where the shoot's Service
    is), under the one name the seed's Role lets the aggregator read."""
    secret = by_kind(installed["shoot"], "Secret", "shoot-access-dwd-lease-aggregator")
    assert secret["metadata"]["labels"] == {
        "resources.gardener.cloud/purpose": "token-requestor",
        "resources.gardener.cloud/class": "shoot",
    }
    assert secret["metadata"]["annotations"] == {
        "serviceaccount.resources.gardener.cloud/name": "dwd-lease-aggregator",
        "serviceaccount.resources.gardener.cloud/namespace": "kube-system",
        "serviceaccount.resources.gardener.cloud/inject-ca-bundle": "true",
    }
    assert "data" not in secret
    objects = load_docs(
        base64.b64decode(
            by_kind(installed["shoot"], "Secret", OBJECTS_SECRET)["data"]["objects.yaml"]
        ).decode()
    )
    # Its ServiceAccount is the token requestor's to create, not the ManagedResource's.
    assert not [
        d
        for d in objects
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "dwd-lease-aggregator"
    ]
    binding = by_kind(objects, "ClusterRoleBinding", "dwd-lease-aggregator-shoot")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dwd-lease-aggregator", "namespace": "kube-system"}
    ]
    role = by_kind(kustomize_build(ROOT / "manifests" / "seed"), "ClusterRole", "dwd-lease-aggregator")
    readable = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert readable[0]["resourceNames"] == ["shoot-access-dwd-lease-aggregator"]
    with plane.admin_client() as admin:
        stored = admin.get(f"/api/v1/namespaces/{SHOOT_NS}/secrets/shoot-access-dwd-lease-aggregator")
        assert stored["metadata"]["labels"]["resources.gardener.cloud/purpose"] == "token-requestor"
