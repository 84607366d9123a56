"""A slow path is not a broken one: real agents, the real API server, a load balancer that adds
round-trip time (every new connection pays one more, as a TCP handshake over that path would).

On loopback, so no root is needed; tests/e2e/test_slow_path.py runs the same faults with
agents in network namespaces, a real resolver and the aggregator.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from core.lease import LAST_OUTAGE, RENEW_INTERVAL, Outage
from testenv.base.process import Process
from testenv.base.wait import wait_for
from testenv.net.tcpproxy import TcpProxy
from testenv.worlds.agents import Agents

pytestmark = pytest.mark.integration

LEASE_DURATION_S = 8.0  # the aggregator's default


@pytest.fixture
def lb(agents: Agents) -> Iterator[TcpProxy]:
    kapi_port = int(agents.cp.url.rsplit(":", 1)[1])
    proxy = TcpProxy(upstream=("127.0.0.1", kapi_port)).open()
    yield proxy
    proxy.shutdown()


def start_behind(agents: Agents, lb: TcpProxy, node: str, interval: str = "2s") -> Process:
    # The interval as the aggregator hands it out: through the lease's annotation.
    agents.create_lease(node, **{RENEW_INTERVAL: interval})
    agent = agents.start(agents.env(node, DWD_APISERVER_URL=f"https://localhost:{lb.port}"))
    wait_for(lambda: renew_time(agents, node), 15, "the first renewal")
    return agent


def renew_time(agents: Agents, node: str) -> str | None:
    return ((agents.lease(node) or {}).get("spec") or {}).get("renewTime")


def max_gap(seen: list[tuple[float, str]], until: float) -> float:
    """The longest time the lease went without a renewal, as an observer polling it saw."""
    times = [t for t, _ in seen] + [until]
    return max(b - a for a, b in itertools.pairwise(times))


@pytest.mark.parametrize("rtt_ms", [300, 600])
def test_a_slow_path_keeps_renewing_through_new_connections(
    agents: Agents, lb: TcpProxy, rtt_ms: int
) -> None:
    """Added round trip on every byte, and the load balancer drops every connection once: the
    agent must make a new connection over the slow path (DNS, TCP, TLS, the request) and go on.
    The old policy (1 s per attempt, a retry only after a failure) never got one through at
    +600 ms: it failed for as long as the delay lasted. (+1000 ms is at the edge of what a new
    connection can do in a 4 s window, three round trips: `make bench` shows it.)"""
    agent = start_behind(agents, lb, f"slow-{rtt_ms}")
    lb.delay_s = rtt_ms / 1000
    before = len(agent.events())
    seen = agents.renew_times(f"slow-{rtt_ms}", 8)
    lb.cut()  # every open connection dropped; new ones accepted at once
    seen += agents.renew_times(f"slow-{rtt_ms}", 16)
    until = time.monotonic()
    events = agent.events()[before:]
    failing = [e for e in events if e["event"] == "renew_failing"]
    gap = max_gap(seen, until)
    assert failing == [], (
        f"+{rtt_ms} ms: {len(seen)} renewals in 24 s, longest gap {gap:.1f} s, {failing[:2]}"
    )
    assert gap < LEASE_DURATION_S / 2, f"+{rtt_ms} ms: longest gap {gap:.1f} s"
    assert len(seen) >= 24 / 2 / 2, f"+{rtt_ms} ms: only {len(seen)} renewals in 24 s"


def test_renewals_that_land_unanswered_are_no_outage(agents: Agents, lb: TcpProxy) -> None:
    """Phantom renewals: each PATCH reaches KAPI and is applied, its answer comes after the agent
    stopped waiting. The lease never goes stale, so the agent must not report an outage (the old
    agent wrote one of the whole episode into last-outage)."""
    node = "phantom-1"
    agent = start_behind(agents, lb, node, interval="500ms")  # a 1 s window
    lb.delay_s = 1.6  # a request lands 0.8 s after it was sent, its answer 0.8 s later
    wait_for(lambda: "renew_failing" in agent.names(), 10, "the agent to stop getting answers")
    seen = agents.renew_times(node, 6)
    assert len(seen) >= 3, f"the lease should keep being renewed by unanswered PATCHes: {seen}"
    assert max_gap(seen, time.monotonic()) < LEASE_DURATION_S / 2
    lb.delay_s = 0.0
    wait_for(lambda: "renew_recovered" in agent.names(), 15, "answers again")
    time.sleep(1.5)  # a renewal or two after the recovery
    # Either the agent's read saw an unanswered renewal land, or the path healed before any
    # read got an answer and nothing was proven; at most the renewal in flight at the heal
    # (one window, 1 s) can be proven lost, never the whole episode.
    recovered = next(e for e in agent.events() if e["event"] == "renew_recovered")
    assert recovered["outage_s"] <= 2.0, recovered
    annotations = (agents.lease(node) or {})["metadata"].get("annotations") or {}
    if LAST_OUTAGE in annotations:
        assert Outage.from_annotation(annotations[LAST_OUTAGE]).duration_s <= 2.0, annotations[LAST_OUTAGE]


def test_a_load_balancer_that_forwards_nothing_is_an_outage_within_the_lease_duration(
    agents: Agents, lb: TcpProxy
) -> None:
    """Connections are accepted (the handshake with the load balancer succeeds) and nothing
    comes back: no renewal lands, the agent reports timeout within its window, and the record
    after the heal says where each connection was stuck."""
    node = "hole-1"
    agent = start_behind(agents, lb, node)
    lb.delay_s = 0.3
    time.sleep(3)
    lb.blackhole = True  # the warm connection stays open and goes silent; new ones are accepted into it
    cut = time.monotonic()
    wait_for(lambda: "renew_failing" in agent.names(), LEASE_DURATION_S, "the outage noticed")
    noticed = time.monotonic() - cut
    failing = next(e for e in agent.events() if e["event"] == "renew_failing")
    assert failing["failure"] == "timeout", failing
    assert noticed < LEASE_DURATION_S, noticed
    last = (agents.lease(node) or {})["spec"]["renewTime"]
    time.sleep(4)
    assert (agents.lease(node) or {})["spec"]["renewTime"] == last  # nothing lands
    lb.blackhole = False  # for new connections: the old one stays dead, as behind a real LB
    wait_for(lambda: "renew_recovered" in agent.names(), 15, "recovery")
    wait_for(
        lambda: LAST_OUTAGE in ((agents.lease(node) or {})["metadata"].get("annotations") or {}),
        5,
        "the record",
    )
    outage = Outage.from_annotation((agents.lease(node) or {})["metadata"]["annotations"][LAST_OUTAGE])
    assert outage.failure_class == "timeout"
    assert outage.path is not None
    stuck = {p.get("stuck") for p in outage.path["failed"]}
    assert stuck & {"tls", "request"}, outage.path  # connected to the load balancer, then nothing
    assert outage.path["last_ok"].get("request", 0) >= 0.25, outage.path  # it was slow before it broke
