"""A slow path is not a broken one: the whole chain at default timings (testenv/worlds/chain.py),
ten nodes, the real aggregator.

Slow: +150, +300 and +600 ms round trip on every node's load balancer, or DNS
answers 500 ms late, for 40 s with every connection cut half-way (so each agent
must also connect anew through the slow path): no agent reports a failing
renewal, the aggregator never counts a lease stale and never scales down.

Broken: 7 of 10 paths at +300 ms turn into a blackhole (the load balancer
accepts and forwards nothing, or iptables drops every packet): those agents
report timeouts, the aggregator counts exactly those leases stale a lease
duration after it last saw them renewed (plus at most one tick), the
controllers go down, and come back once the paths are healed (still at +300 ms).

Each test measures what it asserts and says it in the failure message (and prints it when it
passes: ``pytest -rP``). The slow cases share one chain, each undoing its slowness; each broken
case has its own (a fresh shoot and ten namespaces take 15-20 s before the aggregator judges
every node).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testenv.base.wait import wait_for
from testenv.kube.controllers import CONTROLLERS
from testenv.kube.controlplane import ControlPlane
from testenv.worlds.chain import (
    LEASE_DURATION_S,
    STATUS_EVERY_S,
    TICK_S,
    Chain,
    agent_record,
    chain,
    latencies,
)
from testenv.worlds.networld import Node, World

pytestmark = pytest.mark.e2e

WINDOW_S = 40.0


@dataclass(frozen=True)
class Slow:
    rtt_s: float = 0.0
    dns_delay_s: float = 0.0

    def apply(self, c: Chain) -> None:
        for lb in c.lbs:
            lb.delay_s = self.rtt_s
        assert c.world.dns is not None
        c.world.dns.delay_s = self.dns_delay_s


def report(c: Chain, t0: float, t1: float, cut: float | None = None) -> str:
    """One line per node: what its agent did and what the aggregator saw of it (and how many
    renewals came after ``cut``, when the connections were cut)."""
    lines = []
    for node in c.nodes:
        rec = agent_record(node, t0, t1)
        took, unacked = latencies(c.leases.between(node.name, t0, t1), rec.renewed)
        parts = [f"{len(rec.renewed)} renewals", f"{rec.retries} retries"]
        if cut is not None:
            parts[0] += f" ({len([t for t in rec.renewed if t >= cut])} after the cut)"
        if took:
            parts.append(f"took median {statistics.median(took):.2f}s max {max(took):.2f}s")
        parts += [
            f"{unacked} landed unacknowledged",
            f"longest renewTime gap {c.leases.max_gap(node.name, t0, t1):.1f}s",
            f"longest age seen by the aggregator {c.view.max_age(node.name, t0, t1):.1f}s",
            f"{node.lb.connections} connections",
        ]
        parts += [f"FAILING {e['failure']}: {e.get('error', '')[:60]}" for e in rec.failing]
        lines.append(f"{node.name}: " + ", ".join(parts))
    views = c.view.between(t0, t1)
    lines.append(
        f"aggregator: {len(views)} views, phases {sorted({v.phase for v in views})}, "
        f"max stale {max((v.stale for v in views), default=-1)}, "
        f"candidates {sorted({v.candidates for v in views})}, "
        f"judging throughout: {all(v.judging for v in views)}, "
        f"controllers scaled down: {c.scaled_down_since(t0)}"
    )
    return "\n".join(lines)


def half_open(node: Node, on: bool) -> None:
    node.lb.blackhole = on


def dropped(node: Node, on: bool) -> None:
    node.iptables("-I" if on else "-D", "-j", "DROP")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "breaks",
    [pytest.param(half_open, id="lb-half-open"), pytest.param(dropped, id="iptables-drop")],
)
def test_a_broken_path_at_300ms_is_detected(
    seed_plane: ControlPlane, tmp_path: Path, breaks: Callable[[Node, bool], None]
) -> None:
    name = f"shoot--broken--{breaks.__name__.replace('_', '-')}"
    with chain(seed_plane, tmp_path, name) as c:
        c.wait_judging()
        for lb in c.lbs:
            lb.delay_s = 0.3
        time.sleep(2 * 2.0)  # two renewals at the slow pace
        broken, fine = c.nodes[:7], c.nodes[7:]
        t_cut = time.time()
        for node in broken:
            breaks(node, True)
        wait_for(
            lambda: c.shoot.replicas() == dict.fromkeys(CONTROLLERS, 0), 40, "the scale-down", every_s=0.1
        )
        t_down = time.time()
        what = f"{breaks.__name__} on 7 of 10 at +300ms, scaled down {t_down - t_cut:.1f}s after\n" + report(
            c, t_cut, t_down
        )

        # Every broken agent says so, as a timeout; the others never do.
        for node in broken:
            failing = agent_record(node, t_cut, t_down).failing
            assert failing, f"{node.name} never reported failing\n{what}"
            assert failing[0]["failure"] == "timeout", f"{node.name}: {failing[0]}\n{what}"
        assert not [e for n in fine for e in agent_record(n, t_cut, t_down).failing], what

        # The aggregator counted exactly the seven stale, a lease duration (plus at most one tick,
        # plus our 200 ms sampling) after it last saw the last of them renewed.
        counted = c.view.first(lambda v: v.stale >= len(broken), after=t_cut)
        assert counted is not None, what
        last_seen = max(c.view.seen_renewed(n.name, counted.wall) for n in broken)
        detected_s = counted.wall - last_seen
        what += f"\nall 7 counted stale {detected_s:.2f}s after the aggregator last saw one renewed"
        assert LEASE_DURATION_S - 0.3 <= detected_s <= LEASE_DURATION_S + TICK_S + STATUS_EVERY_S + 0.2, what
        assert max(v.stale for v in c.view.between(t_cut, t_down)) == len(broken), what
        assert max(c.view.max_age(n.name, t_cut, t_down) for n in fine) < LEASE_DURATION_S, what

        # Healed, still at +300 ms: every agent renews again and the controllers come back.
        t_heal = time.time()
        for node in broken:
            breaks(node, False)
        wait_for(lambda: c.shoot.replicas() == CONTROLLERS, 60, "the controllers back", every_s=0.1)
        t_up = time.time()
        what += f"\nhealed; controllers back {t_up - t_heal:.1f}s later\n" + report(c, t_heal, t_up)
        print(what)
        for node in broken:
            assert agent_record(node, t_heal, t_up).recovered, f"{node.name} did not recover\n{what}"


def test_loss_rules_drop_packets_and_go_with_the_world(control_plane: ControlPlane, tmp_path: Path) -> None:
    """The loss helper really drops (all of it at 1.0), and World.close() removes its rules even
    when the test that set them failed."""
    world = World(control_plane, tmp_path)

    def reaches_lb(node: Node) -> bool:
        probe = ["timeout", "2", "bash", "-c", f"exec 3<>/dev/tcp/{node.ns.host_ip}/443"]
        return subprocess.run(node.ns.argv(probe), capture_output=True, check=False).returncode == 0

    def rules() -> str:
        return subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout

    with pytest.raises(RuntimeError, match="a failed test"):
        try:
            node = world.add_node("e2e-loss")
            assert reaches_lb(node)
            node.set_loss(1.0)
            assert rules().count(node.ns.host_if) == 2  # one rule each way
            assert not reaches_lb(node)
            node.set_loss(0.3)  # replaces, never adds up
            assert rules().count(node.ns.host_if) == 2
            raise RuntimeError("a failed test")
        finally:
            world.close()
    assert node.ns.host_if not in rules()


# Last in the module: the shared chain lives until the module ends, and must not run beside the
# broken cases' timings.
@pytest.fixture(scope="module")
def slow_chain(seed_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    """One chain for every slow case: each measures only its own window, and leaves the path
    as fast as it found it (a fresh shoot and ten namespaces cost 15-20 s a case)."""
    with chain(seed_plane, tmp_path_factory.mktemp("slow"), "shoot--slow") as c:
        yield c


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "slow",
    [
        pytest.param(Slow(rtt_s=0.15), id="rtt+150ms"),
        pytest.param(Slow(rtt_s=0.3), id="rtt+300ms"),
        pytest.param(Slow(rtt_s=0.6), id="rtt+600ms"),
        pytest.param(Slow(dns_delay_s=0.5), id="dns+500ms"),
    ],
)
def test_a_slow_path_is_not_a_broken_one(slow_chain: Chain, slow: Slow) -> None:
    c = slow_chain
    c.wait_judging()
    try:
        _slow_window(c, slow)
    finally:
        Slow().apply(c)


def _slow_window(c: Chain, slow: Slow) -> None:
    """Slow for a window, every connection cut half-way: nothing fails, nothing goes stale."""
    assert c.world.dns is not None
    queries = c.world.dns.queries
    t0 = time.time()
    slow.apply(c)
    time.sleep(WINDOW_S / 2)
    connections = [lb.connections for lb in c.lbs]
    t_cut = time.time()
    c.cut_connections()
    time.sleep(WINDOW_S / 2)
    t1 = time.time()
    what = f"{slow}, {WINDOW_S:.0f}s, connections cut at {WINDOW_S / 2:.0f}s\n" + report(c, t0, t1, t_cut)
    print(what)  # the numbers of a passing run too (pytest -rP)

    # The cut made every agent connect (and look the name up) again, through the slow path.
    assert all(lb.connections > n for lb, n in zip(c.lbs, connections, strict=True)), what
    assert c.world.dns.queries >= queries + len(c.nodes), what
    # The agents: not one failing renewal.
    assert not [e for n in c.nodes for e in agent_record(n, t0, t1).failing], what
    # The aggregator judged throughout, and never counted a lease stale: its count of stale
    # leases is the number its verdict is made of, and each lease's age is the gap it judges.
    views = c.view.between(t0, t1)
    assert len(views) >= WINDOW_S / STATUS_EVERY_S / 2, what
    assert all(v.judging and v.candidates == len(c.nodes) for v in views), what
    assert max(v.stale for v in views) == 0, what
    assert max(c.view.max_age(n.name, t0, t1) for n in c.nodes) < LEASE_DURATION_S, what
    assert {v.phase for v in views} == {"healthy"}, what
    assert not c.scaled_down_since(t0), what
