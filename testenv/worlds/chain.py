"""The whole chain at default timings, and what it is seen to do: for the slow-path tests and
``bench.path``.

A shoot and its seed, nodes in network namespaces whose real agents reach KAPI
through DNS and a load balancer each, the real aggregator on the internal
address. Every timing a path is judged by is the default: the agents renew
every 2 s with 1 s attempts, the aggregator calls a lease stale after 8 s and
confirms for 4 s. Only what says nothing about a path stays short: a node is a
candidate at once (no 60 s grace), and the controllers come back without
dependency-watchdog's 30 s level delays.

Three records, each from a place the faults do not touch:
- what the aggregator sees, from its ``/status`` every 200 ms: its phase, how
  many leases its last tick counted stale, and each lease's age on its own
  clock (since it last saw renewTime change: the gap it judges);
- what lands on the leases, listed every 100 ms through the admin client
  straight to the shoot KAPI, never through a node's path;
- what each agent did, from its debug log (every renewal, retry and change of
  state) and its counters.

The shoot's control plane, the network's threads, the agents and the aggregator run ahead of
other worlds on the CPU where that is allowed (``ahead_on_the_cpu``): in CI a fine node's load
balancer thread, starved beside four workers, once forwarded nothing for 10 s, and its agent
reported timeouts on a path that was only slow.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from core.lease import parse_micro_time
from testenv.base.kapi import node_leases
from testenv.base.poller import Poller
from testenv.base.process import Process, ahead_on_the_cpu
from testenv.base.wait import wait_for
from testenv.gardener.apply import kustomize_build
from testenv.kube.controllers import CONTROLLERS
from testenv.kube.controlplane import ControlPlane, free_port
from testenv.kube.standins import grant_agent_rbac
from testenv.net.dns import DnsServer
from testenv.net.names import EXTERNAL_NAMES
from testenv.net.tcpproxy import TcpProxy
from testenv.worlds.networld import Node, World
from testenv.worlds.shoot_world import Sampler, Shoot, shoot_for

# The aggregator's defaults for everything a path is judged by (FAST_ENV shortens them).
AGGREGATOR_DEFAULTS = {
    "DWD_LEASE_DURATION": "6s",
    "DWD_RENEW_INTERVAL": "2s",
    "DWD_CONFIRM_PERIOD": "3s",
    "DWD_RECOVERY_PERIOD": "10s",
}
LEASE_DURATION_S = 6.0
RENEW_INTERVAL_S = 2.0
RENEWAL_WINDOW_S = 4.0  # how long one renewal may take at the default 2 s interval (docs/agent.md)
TICK_S = 1.0  # the aggregator judges every min(1 s, lease duration / 4)
STATUS_EVERY_S = 0.2
LEASES_EVERY_S = 0.1
AGENT_METRICS_PORT = 9100
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def epoch(iso: str) -> float:
    """A structlog timestamp or a MicroTime as seconds since the epoch."""
    if len(iso) == 27:  # MicroTime: exactly six fractional digits and Z
        return parse_micro_time(iso).timestamp()
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# Beside a failed request: an answer cut short or without a key, from an aggregator or a KAPI
# the faults are hitting. Counted; the record goes on.
ERRORS: tuple[type[BaseException], ...] = (httpx.HTTPError, OSError, ValueError, KeyError)


@dataclass(frozen=True)
class View:
    """One answer of the aggregator's /status, for our one target."""

    wall: float
    phase: str
    stale: int
    candidates: int
    judging: bool
    lease_ages: dict[str, float]


class AggregatorView(Poller):
    def __init__(self, url: str) -> None:
        super().__init__("aggregator-view", STATUS_EVERY_S, errors=ERRORS)
        self.http = httpx.Client(base_url=url, timeout=2.0, trust_env=False)
        self.views: list[View] = []

    def step(self) -> None:
        targets = self.http.get("/status").raise_for_status().json()["targets"]
        if targets:
            t = targets[0]
            self.views.append(
                View(
                    time.time(),
                    str(t["phase"]),
                    int(t["stale"]),
                    int(t["candidates"]),
                    not t["view"],
                    {k: float(v) for k, v in t["lease_ages"].items()},
                )
            )

    def close(self) -> None:
        self.http.close()

    def between(self, t0: float, t1: float = float("inf")) -> list[View]:
        return [v for v in list(self.views) if t0 <= v.wall <= t1]

    def latest(self) -> View | None:
        return self.views[-1] if self.views else None

    def first(self, predicate: Callable[[View], bool], after: float) -> View | None:
        return next((v for v in self.between(after) if predicate(v)), None)

    def max_age(self, node: str, t0: float, t1: float = float("inf")) -> float:
        """The longest the aggregator saw this lease go unrenewed, as far as 200 ms samples tell."""
        return max((v.lease_ages.get(node, 0.0) for v in self.between(t0, t1)), default=0.0)

    def seen_renewed(self, node: str, until: float) -> float:
        """When the aggregator last saw this lease renewed, up to ``until`` (wall clock)."""
        return max(
            (v.wall - v.lease_ages[node] for v in self.between(0, until) if node in v.lease_ages),
            default=float("nan"),
        )


class LeaseLog(Poller):
    """Every renewTime each lease carried, read straight from the shoot KAPI."""

    def __init__(self, cp: ControlPlane) -> None:
        super().__init__("lease-log", LEASES_EVERY_S, errors=ERRORS)
        self.client = cp.admin_client()
        self.renewals: dict[str, list[float]] = {}
        self.regressions = 0

    def step(self) -> None:
        for node, lease in node_leases(self.client).items():
            text = (lease.get("spec") or {}).get("renewTime")
            if text:
                seen = self.renewals.setdefault(node, [])
                t = epoch(text)
                if not seen or seen[-1] != t:
                    if seen and t < seen[-1]:
                        # An older attempt landed after a newer one: its request was held up
                        # (retransmitted) and still reached KAPI after the agent gave up on it.
                        self.regressions += 1
                    seen.append(t)

    def close(self) -> None:
        self.client.close()

    def between(self, node: str, t0: float, t1: float) -> list[float]:
        return [t for t in list(self.renewals.get(node, [])) if t0 <= t <= t1]

    def max_gap(self, node: str, t0: float, t1: float) -> float:
        """The longest this lease went without a new renewTime in [t0, t1], counting from the
        renewal before t0 and up to t1."""
        times = sorted(self.renewals.get(node, []))
        before = [t for t in times if t < t0]
        points = before[-1:] + [t for t in times if t0 <= t <= t1] + [t1]
        return max((b - a for a, b in itertools.pairwise(points)), default=t1 - t0)


@dataclass(frozen=True)
class AgentRecord:
    """What one agent did in a window, from its debug log."""

    node: str
    renewed: list[float]  # wall time of every success
    retries: int
    failing: list[dict[str, Any]]  # renew_failing events
    recovered: list[dict[str, Any]]


def agent_record(node: Node, t0: float, t1: float) -> AgentRecord:
    events = [e for e in node.events() if "timestamp" in e and t0 <= epoch(e["timestamp"]) <= t1]

    def named(name: str) -> list[dict[str, Any]]:
        return [e for e in events if e["event"] == name]

    return AgentRecord(
        node.name,
        [epoch(e["timestamp"]) for e in named("lease_renewed")],
        len(named("renew_retry")),
        named("renew_failing"),
        named("renew_recovered"),
    )


def agent_counters(node: Node) -> dict[str, float]:
    """The agent's counters from its /metrics (over its veth: read them while it is not lossy)."""
    text = httpx.get(f"http://{node.ns.ns_ip}:{AGENT_METRICS_PORT}/metrics", timeout=2.0).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("dwd_agent_renewals_total", "dwd_agent_failures_total")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    out["renewals"] = out.get("dwd_agent_renewals_total", 0.0)
    out["failures"] = sum(v for k, v in out.items() if k.startswith("dwd_agent_failures_total"))
    return out


def latencies(renew_times: list[float], renewed: list[float]) -> tuple[list[float], int]:
    """How long each renewal took the agent: from its renewTime (the attempt's start, written by
    the agent) to the agent's log of the answer, both on this machine's clock. An answer belongs
    to the latest renewTime before it: attempts run one after another, and an earlier one may
    land late (its request retransmitted after the agent gave up). A renewTime no answer belongs
    to landed unacknowledged: the agent had given up on it; those are counted apart."""
    starts = sorted(set(renew_times))
    out: list[float] = []
    answered: set[float] = set()
    for t in renewed:
        i = bisect.bisect_right(starts, t)
        if i and t - starts[i - 1] <= RENEWAL_WINDOW_S:
            out.append(t - starts[i - 1])
            answered.add(starts[i - 1])
    return out, len(starts) - len(answered)


@dataclass
class Chain:
    shoot: Shoot
    world: World
    nodes: list[Node]
    aggregator: Process
    view: AggregatorView
    leases: LeaseLog
    replicas: Sampler

    @property
    def lbs(self) -> list[TcpProxy]:
        return [n.lb for n in self.nodes]

    @property
    def dns(self) -> DnsServer:
        assert self.world.dns is not None, "chain() starts the nodes' DNS server"
        return self.world.dns

    def wait_judging(self, timeout_s: float = 60) -> View:
        """Every node a candidate, none stale, the aggregator judging, the controllers up."""

        def ready() -> View | None:
            v = self.view.latest()
            ok = (
                v is not None
                and v.judging
                and v.phase == "healthy"
                and v.candidates == len(self.nodes)
                and v.stale == 0
                and self.shoot.replicas() == CONTROLLERS
            )
            return v if ok else None

        view: View = wait_for(ready, timeout_s, "the aggregator judging every node healthy", every_s=0.2)
        return view

    def cut_connections(self) -> None:
        """Every load balancer drops its open connections: each agent must connect anew."""
        for lb in self.lbs:
            lb.cut()

    def scaled_down_since(self, t0: float) -> bool:
        """Whether any controller was below its replicas in any 100 ms sample since ``t0``."""
        after = time.monotonic() - (time.time() - t0)  # the sampler keeps monotonic time
        samples = self.replicas.between(after)
        assert samples, "no sample of the controllers: the seed was not read"
        return any(s.replicas != CONTROLLERS for s in samples)


@contextlib.contextmanager
def chain(
    seed: ControlPlane,
    tmp: Path,
    namespace: str,
    nodes: int = 10,
    *,
    images: dict[str, str] | None = None,
    settings: dict[str, str] | None = None,
) -> Iterator[Chain]:
    """``images``: run the agents and the aggregator from these (testenv.base.containers.images()),
    the agents as the example overlay's DaemonSet runs them. ``settings``: the aggregator's,
    over its defaults (AGGREGATOR_DEFAULTS)."""
    with ahead_on_the_cpu(), shoot_for(seed, namespace, tmp / "shoot", EXTERNAL_NAMES) as shoot:
        (tmp / "shoot").mkdir(parents=True, exist_ok=True)
        shoot.setup(nodes=nodes)
        shoot.driver.alive.clear()  # real agents renew here, not the driver
        grant_agent_rbac(shoot.shoot_admin)
        world = World(shoot.shoot, tmp)
        pollers: list[Poller] = []
        try:
            members = [world.add_node(f"node-{i}") for i in range(nodes)]
            world.start_dns()
            daemonset = example_daemonset() if images else {}
            for node in members:
                agent_env = {
                    "DWD_LOG_LEVEL": "debug",  # a line per renewal: the record of what it did
                    "DWD_METRICS_ADDR": f"{node.ns.ns_ip}:{AGENT_METRICS_PORT}",
                }
                if images:
                    world.start_agent_container(node, images["agent"], daemonset, agent_env)
                else:
                    world.start_agent(node, agent_env, fast=False)
            port = free_port()
            aggregator = shoot.start_aggregator(
                {**AGGREGATOR_DEFAULTS, **(settings or {}), "DWD_METRICS_ADDR": f"127.0.0.1:{port}"},
                seed=None,
                source=None,
                image=images["aggregator"] if images else None,
            )
            view = AggregatorView(f"http://127.0.0.1:{port}")
            leases = LeaseLog(shoot.shoot)
            pollers += [view, leases]
            for p in pollers:
                p.start()
            c = Chain(shoot, world, members, aggregator, view, leases, shoot.sampler())
            yield c
        finally:
            for p in pollers:
                p.stop()
            world.close()


def example_daemonset() -> dict[str, Any]:
    """The agent's DaemonSet as the example overlay renders it (its external name is this
    world's)."""
    docs = kustomize_build(MANIFESTS / "shoot" / "overlays" / "example")
    ds: dict[str, Any] = next(d for d in docs if d["kind"] == "DaemonSet")
    return ds
