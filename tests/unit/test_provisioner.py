"""Who owns a lease: the agent's DaemonSet beside it (an uninstall takes the leases along), else
its node; and the node's uid, which tells a node re-created under the same name."""

from __future__ import annotations

from core.lease import AGENT_DAEMONSET, DEFAULT_LEASE_NAMESPACE, NODE_UID, node_lease_path
from tests.unit.world import World

DAEMONSET = f"/apis/apps/v1/namespaces/{DEFAULT_LEASE_NAMESPACE}/daemonsets/{AGENT_DAEMONSET}"


async def reconcile(w: World) -> None:
    t = w.target
    for informer in (t.parts.nodes, t.parts.leases):
        await informer.list_now()
    await t.parts.provisioner.reconcile(t.parts.pacer.plan)


def owners(w: World, node: str) -> list[tuple[str, str]]:
    lease = w.shoot.objects[node_lease_path(DEFAULT_LEASE_NAMESPACE, node)]
    return [(r["kind"], r["uid"]) for r in lease["metadata"]["ownerReferences"]]


async def test_the_agents_daemonset_owns_the_leases_and_the_node_is_remembered() -> None:
    w = World(3)
    node = w.names[0]
    await reconcile(w)
    assert owners(w, node) == [("Node", f"uid-{node}")]  # no DaemonSet: as before
    w.shoot.put(DAEMONSET, {"metadata": {"uid": "ds-1"}})
    await reconcile(w)
    assert {n: owners(w, n) for n in w.names} == {n: [("DaemonSet", "ds-1")] for n in w.names}
    lease = w.shoot.objects[node_lease_path(DEFAULT_LEASE_NAMESPACE, node)]
    assert lease["metadata"]["annotations"][NODE_UID] == f"uid-{node}"
    # The node re-created under its name: its lease is rewritten for the new one.
    w.shoot.objects[f"/api/v1/nodes/{node}"]["metadata"]["uid"] = "uid-again"
    await reconcile(w)
    lease = w.shoot.objects[node_lease_path(DEFAULT_LEASE_NAMESPACE, node)]
    assert lease["metadata"]["annotations"][NODE_UID] == "uid-again"
    # A DaemonSet on its way out owns nothing new: the node takes its lease back.
    w.shoot.objects[DAEMONSET]["metadata"]["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    await reconcile(w)
    assert owners(w, node) == [("Node", "uid-again")]


async def test_a_lease_that_only_looks_like_ours_is_never_touched() -> None:
    """kube-system is shared: a leader election, and a lease named like ours without our label
    (for a node that does not exist), stay as they are through a provisioning pass."""
    w = World(2)
    others = {
        f"/apis/coordination.k8s.io/v1/namespaces/{DEFAULT_LEASE_NAMESPACE}/leases/{name}": {
            "metadata": {"annotations": {"owner": "someone else"}},
            "spec": {"holderIdentity": "x"},
        }
        for name in ("kube-controller-manager", "dwd-node-lease-ghost")
    }
    for path, obj in others.items():
        w.shoot.put(path, obj)
    before = {path: dict(w.shoot.objects[path]) for path in others}
    await reconcile(w)
    assert {path: w.shoot.objects.get(path) for path in others} == before
    assert sorted(w.target.parts.observed.own) == sorted(w.names)
