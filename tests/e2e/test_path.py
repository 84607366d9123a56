"""Real agents in network namespaces: real DNS, a load balancer, and faults made by iptables,
by stopping DNS and by tampering with its answers. Every failure gets its class; every outage
is reported on the lease after recovery."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core.errors import NotFound
from core.lease import (
    DEFAULT_LEASE_NAMESPACE,
    LAST_OUTAGE,
    RENEW_INTERVAL,
    Outage,
    lease_metadata,
    leases_path,
    node_lease_path,
)
from testenv.base.wait import wait_for
from testenv.kube.controlplane import ControlPlane, ensure_node
from testenv.kube.kubelet_identity import write_kubeconfig
from testenv.kube.standins import grant_agent_rbac
from testenv.worlds.networld import API, INTERNAL_API, Node, World

pytestmark = pytest.mark.e2e


@pytest.fixture
def world(control_plane: ControlPlane, tmp_path: Path) -> Iterator[World]:
    with control_plane.admin_client() as admin:
        grant_agent_rbac(admin)
    w = World(control_plane, tmp_path)
    try:
        yield w
    finally:
        w.close()


def renew_time(cp: ControlPlane, node: str) -> str | None:
    with cp.admin_client() as admin:
        try:
            value = admin.get(node_lease_path(DEFAULT_LEASE_NAMESPACE, node))["spec"].get("renewTime")
        except NotFound:
            return None  # not provisioned yet
        return None if value is None else str(value)


def outage_then_recovery(
    world: World, node: Node, expected: str, fault: Callable[[], object], fix: Callable[[], object]
) -> Outage:
    before = len(node.events())
    seen = last_outage(world, node)
    fault()
    wait_for(
        lambda: any(e["event"] == "renew_failing" for e in node.events()[before:]),
        20,
        f"a {expected} failure",
    )
    failing = next(e for e in node.events()[before:] if e["event"] == "renew_failing")
    assert failing["failure"] == expected, failing
    time.sleep(1.0)
    fix()
    wait_for(lambda: any(e["event"] == "renew_recovered" for e in node.events()[before:]), 20, "recovery")
    recovered = [e["event"] for e in node.events()[before:]]
    assert recovered.count("renew_failing") <= 2, recovered  # once per state change, not per attempt
    # A record proven by an evidence patch goes out with the next plain renewal (docs/agent.md).
    wait_for(lambda: last_outage(world, node) not in (None, seen), 10, "the outage record")
    return Outage.from_annotation(str(last_outage(world, node)))


def last_outage(world: World, node: Node) -> str | None:
    with world.cp.admin_client() as admin:
        lease = admin.get(node_lease_path(DEFAULT_LEASE_NAMESPACE, node.name))
    return (lease["metadata"].get("annotations") or {}).get(LAST_OUTAGE)


def cut_connections(node: Node) -> None:
    """The load balancer drops every open connection (and keeps listening)."""
    node.lb.close()
    node.lb.open()


def provision(cp: ControlPlane, *nodes: Node) -> None:
    """Each node and its lease, as the aggregator provisions it: with the renew-interval
    annotation."""
    with cp.admin_client() as admin:
        for node in nodes:
            ensure_node(admin, node.name)
            lease = {
                "metadata": {**lease_metadata(node.name), "annotations": {RENEW_INTERVAL: "500ms"}},
                "spec": {},
            }
            admin.ensure(leases_path(DEFAULT_LEASE_NAMESPACE), lease)


def test_the_agent_follows_the_kubelets_server_not_the_external_name(world: World) -> None:
    """Two names lead to KAPI, each through a load balancer of its own; the kubelet kubeconfig
    names the internal one, as in Gardener. Only the kubelet's path breaks: the agent that took
    its server from that kubeconfig fails with it, while an agent pointed at the external name
    (the old default) renews on, proving a path that KCM does not judge."""
    cp = world.cp
    kubelets, external = world.add_node("e2e-kubelet-path"), world.add_node("e2e-external-path")
    internal_lb = world.add_internal_path(kubelets)
    world.add_internal_path(external)
    world.start_dns()
    provision(cp, kubelets, external)
    kubeconfig = write_kubeconfig(
        world.tmp / "kubeconfig-real", f"https://{INTERNAL_API}", cp.ca_file.read_bytes()
    )
    world.start_agent(kubelets, kubeconfig=kubeconfig)
    world.start_agent(external)
    for node in (kubelets, external):
        wait_for(functools.partial(renew_time, cp, node.name), 20, f"renewals of {node.name}")
    started = next(e for e in kubelets.events() if e["event"] == "agent_started")
    assert (started["url"], started["url_from"]) == (f"https://{INTERNAL_API}", str(kubeconfig))
    assert internal_lb.connections >= 1 and kubelets.lb.connections == 0, "not through the kubelet's path"
    assert next(e for e in external.events() if e["event"] == "agent_started")["url"] == f"https://{API}"

    internal_lb.blackhole = True  # the kubelet's path breaks; the external one works on
    wait_for(lambda: any(e["event"] == "renew_failing" for e in kubelets.events()), 20, "the agent failing")
    stuck, moving = renew_time(cp, kubelets.name), renew_time(cp, external.name)
    time.sleep(2)
    assert renew_time(cp, kubelets.name) == stuck, "renewed while the kubelet's path was broken"
    assert renew_time(cp, external.name) != moving, "the external path should still work"

    internal_lb.blackhole = False
    wait_for(lambda: any(e["event"] == "renew_recovered" for e in kubelets.events()), 20, "recovery")


def test_each_fault_on_the_path_is_classified(world: World) -> None:
    cp = world.cp
    node = world.add_node("e2e-faults")
    world.start_dns()
    provision(cp, node)
    world.start_agent(node)
    wait_for(lambda: renew_time(cp, node.name), 20, "renewals through DNS and the load balancer")
    assert world.dns is not None and world.dns.queries >= 1
    assert node.lb.connections >= 1

    # Packets to the load balancer vanish.
    o = outage_then_recovery(
        world,
        node,
        "timeout",
        lambda: node.iptables("-I", "-j", "DROP"),
        lambda: node.iptables("-D", "-j", "DROP"),
    )
    assert o.failure_class == "timeout"

    # The load balancer refuses.
    reject = ("-j", "REJECT", "--reject-with", "tcp-reset")
    o = outage_then_recovery(
        world, node, "connect", lambda: node.iptables("-I", *reject), lambda: node.iptables("-D", *reject)
    )
    assert o.failure_class == "connect"

    # DNS is down: a kept-alive connection does not care...
    dns = world.dns
    dns.stop()
    first = renew_time(cp, node.name)
    time.sleep(1.5)
    assert renew_time(cp, node.name) != first
    # ...until the connection is gone and a new one needs a lookup.
    o = outage_then_recovery(world, node, "dns", lambda: cut_connections(node), dns.start)
    assert o.failure_class == "dns"

    # DNS answers with an impostor's address: its certificate is not signed by the shoot's CA.
    def tamper() -> None:
        world.tampered.add(node.name)
        cut_connections(node)

    o = outage_then_recovery(world, node, "tls", tamper, lambda: world.tampered.discard(node.name))
    assert o.failure_class == "tls"
    assert node.agent is not None and node.agent.alive()


def test_a_broken_path_for_most_nodes_protects_the_shoot(seed_plane: ControlPlane, tmp_path: Path) -> None:
    """The whole chain: agents in their namespaces, the aggregator on the internal address, the
    controllers in the seed. The path breaks for 3 of 5 nodes (their packets to the load balancer
    are dropped), KAPI itself stays up: the controllers go down, and come back when it heals."""
    from testenv.kube.controllers import CONTROLLERS
    from testenv.net.names import EXTERNAL_NAMES
    from testenv.worlds.shoot_world import shoot_for

    with shoot_for(seed_plane, "shoot--e2e--chain", tmp_path / "shoot", EXTERNAL_NAMES) as shoot:
        (tmp_path / "shoot").mkdir(exist_ok=True)
        shoot.setup(nodes=5)
        shoot.driver.alive.clear()  # real agents renew here, not the driver
        with shoot.shoot.admin_client() as admin:
            grant_agent_rbac(admin)
        world = World(shoot.shoot, tmp_path)
        try:
            nodes = [world.add_node(f"node-{i}") for i in range(5)]
            world.start_dns()
            for node in nodes:
                world.start_agent(node)
            agg = shoot.start_aggregator()
            wait_for(lambda: all(renew_time(shoot.shoot, n.name) for n in nodes), 30, "every agent renewing")
            time.sleep(3)
            for node in nodes[:3]:
                node.iptables("-I", "-j", "DROP")
            wait_for(
                lambda: shoot.replicas() == dict.fromkeys(CONTROLLERS, 0), 30, "the scale-down", every_s=0.1
            )
            assert "scale_down_blocked" not in agg.names()  # KAPI answered the internal probe
            for node in nodes[:3]:
                node.iptables("-D", "-j", "DROP")
            wait_for(lambda: shoot.replicas() == CONTROLLERS, 30, "the controllers back", every_s=0.1)
        finally:
            world.close()
