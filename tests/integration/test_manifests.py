"""The manifests, rendered by kustomize and applied to a real API server: least privilege, proven."""

from __future__ import annotations

import base64
import functools
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.model.settings import ShootSettings
from aggregator.observe.sources import FileSource
from core.errors import Forbidden
from core.lease import (
    IGNORE_NODE,
    LAST_OUTAGE,
    LEASE_LABEL,
    NODE_UID,
    RELEASED,
    RENEW_INTERVAL,
    Outage,
    evidence_patch,
    lease_metadata,
    lease_path,
    leases_path,
    node_lease_path,
    release_patch,
    renew_patch,
)
from testenv.base.kapi import Client, denial, unless_forbidden
from testenv.base.wait import wait_for
from testenv.gardener.apply import apply, generated, kustomize_build, load_docs
from testenv.kube.controlplane import ControlPlane, ensure_namespace, ensure_node
from testenv.kube.kubelet_identity import write_kubeconfig
from testenv.kube.standins import deployment
from testenv.net import netns
from testenv.net.names import EXTERNAL_NAMES
from testenv.net.tcpproxy import TcpProxy
from testenv.worlds.agents import pod_env, spawn_agent

pytestmark = pytest.mark.integration

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
NS = "kube-system"
AGENT = "system:serviceaccount:kube-system:dwd-lease-agent"
SEED_AGGREGATOR = "system:serviceaccount:garden:dwd-lease-aggregator"
SHOOT_AGGREGATOR = "system:serviceaccount:kube-system:dwd-lease-aggregator"


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    """A control plane of its own: the admission policy must not leak into other tests."""
    with ControlPlane(extra_sans=EXTERNAL_NAMES).running() as cp:
        yield cp


@pytest.fixture(scope="module")
def installed(plane: ControlPlane) -> dict[str, list[dict[str, Any]]]:
    rendered = {
        "shoot": kustomize_build(MANIFESTS / "shoot" / "overlays" / "example"),
        "shoot-access": kustomize_build(MANIFESTS / "shoot-access"),
        "seed": kustomize_build(MANIFESTS / "seed"),
    }
    with plane.admin_client() as admin:
        ensure_namespace(admin, "garden")
        ensure_namespace(admin, "kube-system")
        for docs in rendered.values():
            apply(admin, docs)  # raises ApplyWarning on any warning
    return rendered


def test_every_manifest_applies_without_warnings(installed: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {d["kind"] for docs in installed.values() for d in docs}
    assert {
        "DaemonSet",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "FlowSchema",
        "PriorityLevelConfiguration",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
    } <= kinds
    # No namespace of our own: every namespaced object of the shoot part is in kube-system,
    # where a shoot's resource manager can deliver it.
    assert "Namespace" not in {d["kind"] for d in installed["shoot"] + installed["shoot-access"]}
    assert {
        d["metadata"].get("namespace")
        for d in installed["shoot"] + installed["shoot-access"]
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "DaemonSet")
    } == {"kube-system", "kube-node-lease"}
    ds = next(d for d in installed["shoot"] if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert (spec["hostNetwork"], spec["dnsPolicy"], spec["priorityClassName"]) == (
        True,
        "Default",
        "system-node-critical",
    )
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # Root only to read kubelet's 0600 kubeconfig, and without a capability.
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    (kubeconfig,) = [v["hostPath"] for v in spec["volumes"] if "hostPath" in v]
    assert kubeconfig == {"path": "/var/lib/kubelet/kubeconfig-real", "type": "File"}  # not its directory
    assert spec["tolerations"] == [{"operator": "Exists"}]
    # /metrics on the node's own address, not on every interface of the host network.
    env = {e["name"]: e for e in container["env"]}
    assert env["HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["DWD_METRICS_ADDR"]["value"] == "$(HOST_IP):16909"
    names = [e["name"] for e in container["env"]]
    assert names.index("HOST_IP") < names.index("DWD_METRICS_ADDR")  # a reference needs it first


def _agent_client(plane: ControlPlane, node: str) -> Client:
    with plane.admin_client() as admin:
        ensure_node(admin, node)
        admin.ensure(leases_path(NS), {"metadata": lease_metadata(node), "spec": {}})
    return plane.token_client(plane.node_token(node))


def test_agent_may_renew_only_its_own_lease(plane: ControlPlane, installed: object) -> None:
    with _agent_client(plane, "node-a") as agent, plane.admin_client() as admin:
        admin.ensure(leases_path(NS), {"metadata": lease_metadata("node-b"), "spec": {}})
        # Leader elections live in kube-system too: the agent's Role reaches them, the policy not.
        admin.ensure(leases_path(NS), {"metadata": {"name": "kube-controller-manager"}, "spec": {}})
        renewed = wait_for(
            lambda: unless_forbidden(
                lambda: agent.merge_patch(
                    node_lease_path(NS, "node-a"), {"spec": {"holderIdentity": "node-a"}}
                )
            ),
            10,
            "RBAC to allow the agent",
        )
        assert renewed["spec"]["holderIdentity"] == "node-a"
        # The admission plugin loads new policies within about a second.
        denied = wait_for(
            lambda: denial(
                lambda: agent.merge_patch(node_lease_path(NS, "node-b"), {"spec": {"holderIdentity": "x"}})
            ),
            10,
            "the admission policy to deny another node's lease",
        )
        assert (
            "dwd-lease-agent on node node-a may only renew lease dwd-node-lease-node-a, "
            "not dwd-node-lease-node-b" in denied
        )
        leader = denial(lambda: agent.merge_patch(lease_path(NS, "kube-controller-manager"), {"spec": {}}))
        assert "not kube-controller-manager" in leader
        before = admin.get(node_lease_path(NS, "node-b"))["spec"].get("holderIdentity")
        with pytest.raises(Forbidden):
            agent.merge_patch(node_lease_path(NS, "node-b"), {"spec": {"holderIdentity": "node-a-again"}})
        assert admin.get(node_lease_path(NS, "node-b"))["spec"].get("holderIdentity") == before
        requests: tuple[Callable[[], object], ...] = (
            lambda: agent.create(leases_path(NS), {"metadata": lease_metadata("node-a2")}),
            lambda: agent.delete(node_lease_path(NS, "node-a")),
            lambda: agent.get(leases_path(NS)),
            lambda: agent.get("/api/v1/namespaces/kube-system/secrets"),
            lambda: agent.get("/api/v1/nodes"),
            lambda: agent.merge_patch(lease_path("kube-node-lease", "node-a"), {}),
        )
        for forbidden in requests:
            with pytest.raises(Forbidden) as e:
                forbidden()
            assert "is forbidden" in str(e.value)


# Each a change an agent could make to its own lease that would let it outlive its node or
# hide from the aggregator (issue: a lease the aggregator can neither restore nor recreate).
LEASE_TAMPERING = {
    "a longer duration": {"spec": {"leaseDurationSeconds": 2147483647}},
    "an acquireTime": {"spec": {"acquireTime": "2026-01-01T00:00:00.000000Z"}},
    "a forged node uid": {"metadata": {"annotations": {NODE_UID: "forged"}}},
    "its own renew interval": {"metadata": {"annotations": {RENEW_INTERVAL: "1h"}}},
    "the operator's ignore-node": {"metadata": {"annotations": {IGNORE_NODE: "true"}}},
    "a finalizer": {"metadata": {"finalizers": ["example.com/keep"]}},
    "no label": {"metadata": {"labels": {LEASE_LABEL: None}}},
    "no owner": {"metadata": {"ownerReferences": []}},
}


def test_on_its_own_lease_the_agent_may_change_only_what_a_renewal_writes(
    plane: ControlPlane, installed: object
) -> None:
    """The real renewal patches (renew_patch with every annotation it writes, evidence_patch)
    pass; the duration, the owner, the label, the finalizers and the aggregator's and the
    operator's annotations are refused, and the lease is unchanged."""
    with plane.admin_client() as admin:
        node = ensure_node(admin, "node-t")
        owner = {"apiVersion": "v1", "kind": "Node", "name": "node-t", "uid": node["metadata"]["uid"]}
        meta = lease_metadata("node-t")
        meta["annotations"] = {NODE_UID: node["metadata"]["uid"], RENEW_INTERVAL: "2s"}
        meta["ownerReferences"] = [owner]
        admin.ensure(leases_path(NS), {"metadata": meta, "spec": {"leaseDurationSeconds": 8}})
    path = node_lease_path(NS, "node-t")
    now = datetime.now(UTC)
    outage = Outage(now - timedelta(seconds=30), 12.0, "timeout")
    with plane.token_client(plane.node_token("node-t")) as agent:
        wait_for(
            lambda: denial(lambda: agent.merge_patch(path, LEASE_TAMPERING["a longer duration"])),
            10,
            "the admission policy to refuse a longer duration",
        )
        renewed = agent.merge_patch(path, renew_patch("node-t", now, last_outage=outage))
        agent.merge_patch(path, release_patch())
        agent.merge_patch(path, renew_patch("node-t", now, clear_released=True))
        agent.request(
            "PATCH", path, evidence_patch("node-t", now), content_type="application/json-patch+json"
        )
        agent.merge_patch(path, renew_patch("node-t", now, clear_previous=True))
        assert renewed["metadata"]["annotations"][LAST_OUTAGE] == outage.to_annotation()
        with plane.admin_client() as admin:
            before = admin.get(path)
        refusals = {
            what: denial(functools.partial(agent.merge_patch, path, patch))
            for what, patch in LEASE_TAMPERING.items()
        }
    wrong = {what: why for what, why in refusals.items() if "may change only spec.holderIdentity" not in why}
    assert wrong == {}, "allowed, or refused for another reason"
    with plane.admin_client() as admin:
        after = admin.get(path)
    for part in ("spec", "metadata"):
        assert {k: v for k, v in after[part].items() if k != "managedFields"} == {
            k: v for k, v in before[part].items() if k != "managedFields"
        }


def test_agent_requests_get_their_own_priority_level(plane: ControlPlane, installed: object) -> None:
    with _agent_client(plane, "node-f") as agent, plane.admin_client() as admin:
        schema = admin.get("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/dwd-lease-agent")
        level = admin.get("/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/dwd-lease-agent")
        wait_for(
            lambda: unless_forbidden(lambda: agent.merge_patch(node_lease_path(NS, "node-f"), {})), 10, "RBAC"
        )
        assert agent.last_headers["X-Kubernetes-PF-FlowSchema-UID"] == schema["metadata"]["uid"]
        assert agent.last_headers["X-Kubernetes-PF-PriorityLevel-UID"] == level["metadata"]["uid"]


def _can(admin: Client, user: str, check: tuple[str, ...]) -> bool:
    verb, resource, namespace, name, sub = check
    group, _, res = resource.rpartition("/") if "/" in resource else ("", "", resource)
    attrs = {
        "verb": verb,
        "group": group,
        "resource": res,
        "namespace": namespace,
        "name": name,
        "subresource": sub,
    }
    review = admin.create(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "resourceAttributes": attrs,
            },
        },
    )
    return bool(review["status"].get("allowed"))


SEED_MAY = [
    ("get", "apps/deployments", "shoot--p--a", "kube-controller-manager", ""),
    ("patch", "apps/deployments", "shoot--p--a", "machine-controller-manager", ""),
    ("patch", "apps/deployments", "shoot--p--a", "cluster-autoscaler", "scale"),
    ("get", "apps/deployments", "shoot--p--a", "kube-controller-manager", "scale"),
    ("create", "events", "shoot--p--a", "", ""),
    ("get", "secrets", "shoot--p--a", "shoot-access-dwd-lease-aggregator", ""),
    ("list", "secrets", "", "shoot-access-dwd-lease-aggregator", ""),
    ("watch", "secrets", "", "shoot-access-dwd-lease-aggregator", ""),
    ("list", "extensions.gardener.cloud/clusters", "", "", ""),
    ("watch", "extensions.gardener.cloud/clusters", "", "", ""),
    ("list", "machine.sapcloud.io/machines", "shoot--p--a", "", ""),  # the Machine rule
    ("create", "coordination.k8s.io/leases", "garden", "", ""),
    ("update", "coordination.k8s.io/leases", "garden", "dwd-lease-aggregator", ""),
    ("list", "coordination.k8s.io/leases", "garden", "", ""),  # the shard and member Leases
    ("update", "coordination.k8s.io/leases", "garden", "dwd-lease-aggregator-shard-15", ""),
    ("update", "coordination.k8s.io/leases", "garden", "dwd-lease-aggregator-member-7", ""),
]
SEED_MUST_NOT = [
    ("delete", "apps/deployments", "shoot--p--a", "kube-controller-manager", ""),
    ("create", "apps/deployments", "shoot--p--a", "", ""),
    ("patch", "apps/deployments", "garden", "gardenlet", ""),
    ("get", "apps/deployments", "shoot--p--a", "etcd-druid", ""),
    ("update", "apps/deployments", "shoot--p--a", "kube-controller-manager", ""),
    ("update", "apps/deployments", "shoot--p--a", "kube-controller-manager", "scale"),
    ("get", "secrets", "shoot--p--a", "ca", ""),
    ("list", "secrets", "shoot--p--a", "", ""),
    ("list", "secrets", "", "", ""),
    ("watch", "secrets", "", "", ""),
    ("create", "pods", "shoot--p--a", "", ""),
    ("patch", "apps/statefulsets", "shoot--p--a", "etcd-main", ""),
    ("update", "extensions.gardener.cloud/clusters", "", "shoot--p--a", ""),
    ("watch", "machine.sapcloud.io/machines", "shoot--p--a", "", ""),
    ("patch", "machine.sapcloud.io/machines", "shoot--p--a", "m1", ""),
    ("delete", "machine.sapcloud.io/machines", "shoot--p--a", "m1", ""),
    ("update", "machine.sapcloud.io/machines", "shoot--p--a", "m1", "status"),
    ("update", "coordination.k8s.io/leases", "garden", "gardenlet-leader-election", ""),
    ("delete", "coordination.k8s.io/leases", "garden", "dwd-lease-aggregator-shard-0", ""),
    ("update", "coordination.k8s.io/leases", "garden", "dwd-lease-aggregator-shard-16", ""),
    ("list", "coordination.k8s.io/leases", "kube-system", "", ""),
    ("patch", "nodes", "", "n1", ""),
]
SHOOT_MAY = [
    ("create", "coordination.k8s.io/leases", NS, "", ""),
    ("patch", "coordination.k8s.io/leases", NS, "dwd-node-lease-n1", ""),
    ("delete", "coordination.k8s.io/leases", NS, "dwd-node-lease-n1", ""),
    ("watch", "coordination.k8s.io/leases", NS, "", ""),
    ("list", "nodes", "", "", ""),
    ("watch", "nodes", "", "", ""),
    ("list", "coordination.k8s.io/leases", "kube-node-lease", "", ""),  # the second witness
    ("get", "apps/daemonsets", NS, "dwd-lease-agent", ""),  # the leases' owner
]
SHOOT_MUST_NOT = [
    ("patch", "coordination.k8s.io/leases", "kube-node-lease", "n1", ""),
    ("update", "coordination.k8s.io/leases", "kube-node-lease", "n1", ""),
    ("delete", "coordination.k8s.io/leases", "kube-node-lease", "n1", ""),
    ("patch", "nodes", "", "n1", ""),
    ("delete", "nodes", "", "n1", ""),
    ("get", "secrets", "kube-system", "", ""),
    ("get", "apps/daemonsets", NS, "kube-proxy", ""),
    ("patch", "apps/daemonsets", NS, "dwd-lease-agent", ""),
    ("create", "pods", "default", "", ""),
]


@pytest.mark.parametrize(
    ("user", "may", "must_not"),
    [
        (SEED_AGGREGATOR, SEED_MAY, SEED_MUST_NOT),
        (SHOOT_AGGREGATOR, SHOOT_MAY, SHOOT_MUST_NOT),
    ],
)
def test_aggregator_rbac_is_exactly_enough(
    plane: ControlPlane,
    installed: object,
    user: str,
    may: list[tuple[str, ...]],
    must_not: list[tuple[str, ...]],
) -> None:
    with plane.admin_client() as admin:
        denied = [a for a in may if not _can(admin, user, a)]
        allowed = [a for a in must_not if _can(admin, user, a)]
    assert denied == [], f"{user} lacks what it needs"
    assert allowed == [], f"{user} may do more than it needs"


def test_the_aggregator_lists_its_kubeconfig_secrets_across_the_seed_and_no_other(
    plane: ControlPlane, installed: object
) -> None:
    """A real request as the seed's service account: the one watch that feeds every target's
    kubeconfig (a field selector on the name, which resourceNames authorizes), and nothing
    beside it."""
    with plane.admin_client() as admin:
        for ns in ("shoot--p--a", "shoot--p--b"):
            ensure_namespace(admin, ns)
            for name in ("shoot-access-dwd-lease-aggregator", "other"):
                admin.ensure(f"/api/v1/namespaces/{ns}/secrets", {"metadata": {"name": name}})
        token = admin.create(
            "/api/v1/namespaces/garden/serviceaccounts/dwd-lease-aggregator/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
    with plane.token_client(token) as aggregator:
        selected = aggregator.get(
            "/api/v1/secrets", fieldSelector="metadata.name=shoot-access-dwd-lease-aggregator"
        )
        assert sorted(i["metadata"]["namespace"] for i in selected["items"]) == ["shoot--p--a", "shoot--p--b"]
        with pytest.raises(Forbidden):
            aggregator.get("/api/v1/secrets")
        with pytest.raises(Forbidden):
            aggregator.get("/api/v1/secrets", fieldSelector="metadata.name=other")


SHOOT_NS = "shoot--p--a"
DEPLOY = "/apis/apps/v1/namespaces/{ns}/deployments"
RECORD_KEYS = {
    "dwd-lease.gardener.cloud/scaled-down": '{"replicas": 3}',
    "dependency-watchdog.gardener.cloud/replicas": "3",
    "dependency-watchdog.gardener.cloud/meltdown-protection-active": "",
}


def _seed_aggregator_token(admin: Client) -> str:
    token: str = admin.create(
        "/api/v1/namespaces/garden/serviceaccounts/dwd-lease-aggregator/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )["status"]["token"]
    return token


def _event(namespace: str, name: str) -> dict[str, Any]:
    return {
        "metadata": {"generateName": "dwd-lease-"},
        "involvedObject": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "namespace": namespace,
            "name": name,
        },
        "reason": "ScaledDown",
        "message": "test",
        "type": "Normal",
    }


# Each a write the seed aggregator's token attempts on a dependent it may patch by RBAC, and
# what refuses it: (name, namespace, deployment name, subresource, merge patch, the words of
# the refusal).
REFUSED: list[tuple[str, str, str, str, dict[str, Any], str]] = [
    (
        "gardenlet's image",
        "garden",
        "gardenlet",
        "",
        {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "evil"}]}}}},
        "forbidden",
    ),
    (
        "a dependent outside a shoot namespace",
        "kube-system",
        "kube-controller-manager",
        "",
        {"spec": {"replicas": 0}},
        "only in shoot control-plane namespaces",
    ),
    (
        "its scale outside a shoot namespace",
        "kube-system",
        "kube-controller-manager",
        "scale",
        {"spec": {"replicas": 0}},
        "only in shoot control-plane namespaces",
    ),
    (
        "a dependent's image",
        SHOOT_NS,
        "kube-controller-manager",
        "",
        {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "evil"}]}}}},
        "only spec.replicas",
    ),
    (
        "a dependent's strategy",
        SHOOT_NS,
        "machine-controller-manager",
        "",
        {"spec": {"minReadySeconds": 30}},
        "only spec.replicas",
    ),
    (
        "a label not ours",
        SHOOT_NS,
        "kube-controller-manager",
        "",
        {"metadata": {"labels": {"app": "other"}}},
        "only its own annotations",
    ),
    (
        "the operator's ignore-scaling",
        SHOOT_NS,
        "kube-controller-manager",
        "",
        {"metadata": {"annotations": {"dependency-watchdog.gardener.cloud/ignore-scaling": "true"}}},
        "only its own annotations",
    ),
    (
        "a finalizer",
        SHOOT_NS,
        "cluster-autoscaler",
        "",
        {"metadata": {"finalizers": ["example.com/hold"]}},
        "only its own annotations",
    ),
]


def _refusal(client: Client, ns: str, name: str, sub: str, patch: dict[str, Any]) -> str:
    """Why the write was refused, or "allowed"."""
    try:
        client.merge_patch(f"{DEPLOY.format(ns=ns)}/{name}" + (f"/{sub}" if sub else ""), patch)
    except Forbidden as e:
        return str(e)
    return "allowed"


def test_the_seed_aggregator_may_change_only_replicas_and_its_record_of_a_dependent(
    plane: ControlPlane, installed: object
) -> None:
    """Real requests with the seed aggregator's own token against the shipped RBAC and
    admission policy: another Deployment, a dependent outside a shoot namespace, a template, a
    label or annotation not ours are refused; the replicas and the record of a dependent, and
    an Event about it, are allowed."""
    names = ("kube-controller-manager", "machine-controller-manager", "cluster-autoscaler")
    with plane.admin_client() as admin:
        for ns, name in [*((SHOOT_NS, n) for n in names), ("kube-system", names[0]), ("garden", "gardenlet")]:
            ensure_namespace(admin, ns)
            admin.ensure(DEPLOY.format(ns=ns), deployment(name, 3))
        token = _seed_aggregator_token(admin)
    with plane.token_client(token) as aggregator:
        # A policy is enforced a moment after its creation (the API server's informer).
        wait_for(
            lambda: _refusal(aggregator, *REFUSED[1][1:5]) != "allowed",
            10,
            "the seed admission policy in force",
            every_s=0.2,
        )
        lowered = {
            "spec": {"replicas": 0},
            "metadata": {"annotations": RECORD_KEYS, "labels": {"dwd-lease.gardener.cloud/scaled-down": "3"}},
        }
        path = f"{DEPLOY.format(ns=SHOOT_NS)}/kube-controller-manager"
        assert aggregator.merge_patch(path, lowered)["spec"]["replicas"] == 0
        restored = {
            "spec": {"replicas": 3},
            "metadata": {
                "annotations": dict.fromkeys(RECORD_KEYS),
                "labels": {"dwd-lease.gardener.cloud/scaled-down": None},
            },
        }
        assert aggregator.merge_patch(path, restored)["spec"]["replicas"] == 3
        scale = f"{DEPLOY.format(ns=SHOOT_NS)}/cluster-autoscaler/scale"
        assert aggregator.merge_patch(scale, {"spec": {"replicas": 0}})["spec"].get("replicas", 0) == 0
        aggregator.create(
            f"/api/v1/namespaces/{SHOOT_NS}/events", _event(SHOOT_NS, "kube-controller-manager")
        )
        refusals = {
            what: _refusal(aggregator, ns, name, sub, patch) for what, ns, name, sub, patch, _ in REFUSED
        }
        wrong = {what: refusals[what] for what, *_, words in REFUSED if words not in refusals[what]}
        assert wrong == {}, "not refused, or refused for another reason"
        for ns, about in ((SHOOT_NS, "etcd-main"), ("garden", "kube-controller-manager")):
            with pytest.raises(Forbidden):
                aggregator.create(f"/api/v1/namespaces/{ns}/events", _event(ns, about))
    with plane.admin_client() as admin:
        kcm = admin.get(f"{DEPLOY.format(ns=SHOOT_NS)}/kube-controller-manager")
        assert kcm["spec"]["template"]["spec"]["containers"][0]["image"] == "kube-controller-manager"
        assert kcm["metadata"]["labels"] == {"app": "kube-controller-manager"}


def test_the_shoot_aggregator_writes_only_leases_of_its_own(plane: ControlPlane, installed: object) -> None:
    """Real requests as kube-system/dwd-lease-aggregator: its Role reaches every lease in
    kube-system, its admission policy only ours (prefix and label, before and after)."""
    with plane.admin_client() as admin:
        admin.ensure(leases_path(NS), {"metadata": {"name": "kube-scheduler"}, "spec": {}})
        admin.ensure(leases_path(NS), {"metadata": {"name": "dwd-node-lease-unlabelled"}, "spec": {}})
        token = admin.create(
            "/api/v1/namespaces/kube-system/serviceaccounts/dwd-lease-aggregator/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
    with plane.token_client(token) as agg:
        created = wait_for(
            lambda: unless_forbidden(
                lambda: agg.create(leases_path(NS), {"metadata": lease_metadata("node-agg"), "spec": {}})
            ),
            10,
            "RBAC to allow the aggregator",
        )
        assert created["metadata"]["labels"] == {LEASE_LABEL: "true"}
        agg.merge_patch(node_lease_path(NS, "node-agg"), {"spec": {"leaseDurationSeconds": 8}})

        def create(metadata: dict[str, Any]) -> Callable[[], None]:
            # Until the policy is in effect (under load it can take a moment), a create may be
            # allowed: the lease is taken away again so the next try meets the same question.
            def attempt() -> None:
                agg.create(leases_path(NS), {"metadata": metadata, "spec": {}})
                with plane.admin_client() as admin:
                    admin.delete(lease_path(NS, metadata["name"]))

            return attempt

        refused = {
            "create without the label": create({"name": "dwd-node-lease-x"}),
            "create without the prefix": create({"name": "x", "labels": {LEASE_LABEL: "true"}}),
            "patch a leader election": lambda: agg.merge_patch(
                lease_path(NS, "kube-scheduler"), {"spec": {}}
            ),
            "delete a leader election": lambda: agg.delete(lease_path(NS, "kube-scheduler")),
            "take over an unlabelled lease": lambda: agg.merge_patch(
                lease_path(NS, "dwd-node-lease-unlabelled"), {"metadata": {"labels": {LEASE_LABEL: "true"}}}
            ),
            "delete an unlabelled lease": lambda: agg.delete(lease_path(NS, "dwd-node-lease-unlabelled")),
            "drop our label": lambda: agg.merge_patch(
                node_lease_path(NS, "node-agg"), {"metadata": {"labels": {LEASE_LABEL: None}}}
            ),
        }
        for what, request in refused.items():
            message = wait_for(functools.partial(denial, request), 10, what)
            assert "dwd-lease-aggregator may only write node leases of its own" in message, what
        # On its own leases, nothing an agent's renewal writes: it cannot forge a node's liveness.
        now = datetime.now(UTC)
        forged = {
            "renew a lease": lambda: agg.merge_patch(
                node_lease_path(NS, "node-agg"), renew_patch("node-agg", now)
            ),
            "set an outage": lambda: agg.merge_patch(
                node_lease_path(NS, "node-agg"), {"metadata": {"annotations": {LAST_OUTAGE: "{}"}}}
            ),
            "create a renewed lease": create(
                {**lease_metadata("node-new"), "annotations": {RELEASED: "true"}}
            ),
            "create a held lease": lambda: agg.create(
                leases_path(NS),
                {"metadata": lease_metadata("node-held"), "spec": {"holderIdentity": "node-held"}},
            ),
        }
        for what, request in forged.items():
            assert "may not write what an agent renewal writes" in denial(request), what
        agg.merge_patch(
            node_lease_path(NS, "node-agg"), {"metadata": {"annotations": {RENEW_INTERVAL: "2s"}}}
        )
        agg.delete(node_lease_path(NS, "node-agg"))


def test_agent_from_the_daemonset_environment_renews(
    plane: ControlPlane, installed: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The DaemonSet's own environment, in a network namespace where the external name resolves
    to a load balancer in front of the API server."""
    why = netns.available()
    if why:
        pytest.skip(why)
    ds = next(d for d in installed["shoot"] if d["kind"] == "DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    node = "node-ds"
    client = _agent_client(plane, node)
    client.close()
    # What kubelet would put into the projected volume (the bound token), and the node's
    # kubelet kubeconfig, whose server is the external name.
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "token").write_text(plane.node_token(node))
    host = EXTERNAL_NAMES[0]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig-real", f"https://{host}", plane.ca_file.read_bytes())
    env: dict[str, str] = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for name, value in pod_env(container, node=node, host_ip="127.0.0.1").items():
        env[name] = value.replace(mounts["credentials"], str(creds)).replace(
            mounts["kubelet-kubeconfig"], str(kubeconfig)
        )
    assert "DWD_APISERVER_URL" not in env  # the kubelet's server, not one of its own
    ns = netns.NetNs().create()
    lb = None
    agent = None
    try:
        ns.write_hosts({host: ns.host_ip})
        kapi_port = int(plane.url.rsplit(":", 1)[1])
        lb = TcpProxy(upstream=("127.0.0.1", kapi_port), listen=(ns.host_ip, 443)).open()
        agent = spawn_agent("agent", env, log_path=tmp_path / "agent.log", netns=ns)
        with plane.admin_client() as admin:
            renewed = wait_for(
                lambda: admin.get(node_lease_path(NS, node))["spec"].get("renewTime"),
                20,
                "a renewal from the namespace",
            )
            time.sleep(2.5)
            assert admin.get(node_lease_path(NS, node))["spec"]["renewTime"] != renewed
        assert lb.connections >= 1
        assert b"lease_renewing" in (tmp_path / "agent.log").read_bytes()
    finally:
        if agent is not None:
            agent.terminate(10)
        if lb is not None:
            lb.shutdown()
        ns.delete()


def test_the_seed_aggregator_reaches_only_dns_and_api_servers(
    installed: dict[str, list[dict[str, Any]]],
) -> None:
    """Outside Gardener its NetworkPolicy: in, its one port; out, DNS and API servers only
    (no etcd, kubelet or metadata endpoint; a Secret's server on another port gets nothing)."""
    (policy,) = [d for d in installed["seed"] if d["kind"] == "NetworkPolicy"]
    (deployment,) = [d for d in installed["seed"] if d["kind"] == "Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    ports = [(p["protocol"], p["port"]) for rule in policy["spec"]["egress"] for p in rule["ports"]]
    assert sorted(ports) == [("TCP", 53), ("TCP", 443), ("TCP", 6443), ("UDP", 53)]
    assert all("to" not in rule or rule["to"] for rule in policy["spec"]["egress"])
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": 8080, "protocol": "TCP"}]


def test_the_agent_memory_limit_is_over_twice_its_measured_size() -> None:
    """24.9 MiB steady from its image (docs/measured.md); what a hostile server can add is
    bounded by agent/wire.py (tests/unit/test_agent_wire_hostile.py)."""
    daemonset = next(
        d
        for d in load_docs((MANIFESTS / "shoot" / "base" / "daemonset.yaml").read_text())
        if d["kind"] == "DaemonSet"
    )
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    mib = {k: int(v.removesuffix("Mi")) for k, v in agent["resources"]["limits"].items()}
    assert (
        mib["memory"] >= 2 * 24.9 and int(agent["resources"]["requests"]["memory"].removesuffix("Mi")) >= 24.9
    )


async def test_the_file_targets_example_is_what_the_aggregator_reads(tmp_path: Path) -> None:
    """manifests/seed-file-targets: the seed Deployment outside Gardener, its shoots from a
    ConfigMap; its targets file and its hand-made Secret are in the shapes the aggregator takes."""
    docs = kustomize_build(MANIFESTS / "seed-file-targets")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert env["DWD_TARGETS"] == f"file:{mounts['targets']}/targets.yaml"
    assert volumes["targets"]["configMap"]["name"] == config["metadata"]["name"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    (tmp_path / "targets.yaml").write_text(config["data"]["targets.yaml"])
    wanted = await FileSource(str(tmp_path / "targets.yaml"), ShootSettings().kubeconfig_secret).desired()
    assert {n: s.kubeconfig_secret for n, s in wanted.items()} == {
        "shoot--dev--one": "shoot-access-dwd-lease-aggregator",
        "shoot--dev--two": "my-shoot-kubeconfig",
    }
    # Every Secret the targets name is one the rendered RBAC lets the aggregator read (the
    # example named one the seed's ClusterRole refused).
    readable = {
        name
        for d in docs
        if d["kind"] == "ClusterRole"
        for rule in d["rules"]
        if "secrets" in rule["resources"] and {"get", "list", "watch"} <= set(rule["verbs"])
        for name in rule.get("resourceNames", [])
    }
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert {r["metadata"]["name"] for r in docs if r["kind"] == "ClusterRole"} <= bound
    assert {s.kubeconfig_secret for s in wanted.values()} <= readable, readable
    secret = yaml.safe_load(
        (MANIFESTS / "seed-file-targets" / "shoot-access-secret.example.yaml").read_text()
    )
    assert secret["metadata"]["name"] == ShootSettings().kubeconfig_secret
    assert yaml.safe_load(secret["stringData"]["kubeconfig"])["current-context"] == "shoot"


IMAGE = {
    "dwd-lease-agent": "registry.example/team/dwd-lease-agent",
    "dwd-lease-aggregator": "registry.example/team/dwd-lease-aggregator",
}


@pytest.mark.parametrize(
    ("install", "image"),
    [
        ("shoot/base", "dwd-lease-agent"),
        ("seed", "dwd-lease-aggregator"),
        ("seed-file-targets", "dwd-lease-aggregator"),
        ("gardener/seed", "dwd-lease-aggregator"),
        ("gardener/shoot/objects", "dwd-lease-agent"),  # rendered into the ManagedResource's Secret
    ],
)
def test_an_image_set_in_its_one_place_is_the_one_every_install_path_renders(
    tmp_path: Path, install: str, image: str
) -> None:
    """Each install path takes its image from one ``images:`` entry (docs/install.md): an overlay
    of it, or for the ManagedResource the kustomization its objects are rendered from."""
    tree = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, tree)
    pinned = f"{IMAGE[image]}@sha256:{'0' * 64}"
    entry = {"name": image, "newName": IMAGE[image], "digest": f"sha256:{'0' * 64}"}
    if install == "gardener/shoot/objects":
        kustomization = tree / install / "kustomization.yaml"
        doc = yaml.safe_load(kustomization.read_text())
        kustomization.write_text(yaml.safe_dump(doc | {"images": [entry]}))
        (tmp_path / "manifests" / "gardener" / "shoot" / "objects.yaml").write_text(
            generated(tmp_path, "manifests/gardener/shoot/objects.yaml")
        )
        secret = next(d for d in kustomize_build(tree / "gardener" / "shoot") if d["kind"] == "Secret")
        docs = load_docs(base64.b64decode(secret["data"]["objects.yaml"]).decode())
    else:
        overlay = tmp_path / "overlay"
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(
            yaml.safe_dump({"resources": [f"../manifests/{install}"], "images": [entry]})
        )
        docs = kustomize_build(overlay)
    workloads = [d for d in docs if d["kind"] in ("DaemonSet", "Deployment")]
    images = {c["image"] for w in workloads for c in w["spec"]["template"]["spec"]["containers"]}
    assert images == {pinned}
