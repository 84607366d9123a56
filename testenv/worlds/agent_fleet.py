"""A fleet of N simulated agents in one asyncio process, against a real kube-apiserver.

Each simulated node is a Node object (zone label round-robin over zone-a/b/c) and a task
that renews the node's Lease the way agent/renewer.py does: the agent's own merge patch
(``core.lease.renew_patch``), the interval adopted from the ``renew-interval`` annotation
of each PATCH answer, the next renewal at ``core.lease.next_renewal_in_s`` after the
stamp of this one (fixed rate for fast intervals, the node's phase for slow ones), a 404
(lease not provisioned yet) waited out as the agent does (``core.lease.missing_wait_s``). The first
renewal of each node falls at a random point of its first interval, as a DaemonSet's
pods start spread out.

Where the request pattern differs from N real agents, and what that does to the
figures:

- **One connection pool, not N connections.** All renewals go over one
  ``httpx.AsyncClient`` with HTTP/2: a few TLS connections carrying many streams. N
  agents hold N kept-alive connections (N TLS sessions, N sets of kernel buffers, and a
  new handshake for every agent whose connection a broken path closed). KAPI's cost per
  connection and per handshake is therefore missing here; its cost per request is not.
  After an outage real agents reconnect (N handshakes at once); the simulator does not.
- **An admin client certificate, not bound service-account tokens.** Real agents send a
  projected token: KAPI verifies its signature and, for bound tokens, looks up the pod it
  is bound to (cached), then runs the Node/RBAC authorizers on a service account. The
  admin certificate is in system:masters, which RBAC allows at once and API priority and
  fairness exempts. Per-request authentication and authorization cost is lower here, and
  the heartbeats are never queued by APF as the agents' would be (their FlowSchema's
  priority level limits their concurrency).
- **No evidence patches, no outage records.** The agent sends a JSON patch that copies
  the old renewTime (``evidence_patch``) after unanswered renewals and writes a
  ``last-outage`` annotation once it recovers; a silenced node here just stops sending
  and, when resumed, sends the plain merge patch. Recovery writes are slightly smaller
  than real ones and carry no annotations.
- **Silence is "nothing sent"**, not a broken path: no timeouts, no half-open
  connections, no retries inside the agent's window. A silenced node tries again after
  its interval, as an agent whose renewal failed does; what KAPI sees is the same
  (nothing), what the agent's host sees is not simulated.
- **One clock.** All nodes share this process's wall clock, so the slow nodes' phases
  are spread exactly as ``renewal_phase_s`` intends; real nodes' clock skew would only
  shift them.
- **The same client CPU**: the simulator runs on the machine it measures, so at high
  rates it competes with KAPI and etcd for the same cores; an agent costs its own node.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import random
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx

from core.durations import parse_duration
from core.lease import (
    DEFAULT_LEASE_NAMESPACE,
    DEFAULT_RENEW_INTERVAL_S,
    MAX_RENEW_INTERVAL_S,
    MAX_RENEWAL_WINDOW_S,
    MIN_RENEW_INTERVAL_S,
    PHASED_FROM_S,
    RENEW_INTERVAL,
    missing_wait_s,
    next_renewal_in_s,
    node_lease_path,
    renew_patch,
)

ZONES = ("zone-a", "zone-b", "zone-c")
ZONE_LABEL = "topology.kubernetes.io/zone"

T = TypeVar("T")


@dataclass
class SimNode:
    name: str
    zone: str
    interval_s: float = DEFAULT_RENEW_INTERVAL_S
    renewals: int = 0
    last_renewed: float = 0.0  # time.monotonic() of the last successful renewal
    misses: int = 0  # 404s in a row
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Fleet:
    """N simulated agents; create, silence, resume, add and remove them while they run.

    All methods that are coroutines run on the fleet's event loop; ``FleetThread`` runs
    one in a thread for synchronous callers (tests, benchmarks).
    """

    def __init__(
        self,
        url: str,
        ca_file: str | Path,
        cert: tuple[str, str],
        *,
        namespace: str = DEFAULT_LEASE_NAMESPACE,
        prefix: str = "fleet-node",
        max_in_flight: int = 256,
        seed: int = 1,
    ) -> None:
        self.url = url.rstrip("/")
        self.namespace = namespace
        self.prefix = prefix
        tls = ssl.create_default_context(cafile=str(ca_file))
        tls.load_cert_chain(cert[0], cert[1])
        # The pool, not one connection per node: see the module docstring.
        self.http = httpx.AsyncClient(
            base_url=self.url,
            http2=True,
            verify=tls,
            trust_env=False,
            timeout=httpx.Timeout(MAX_RENEWAL_WINDOW_S),
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
        )
        self._gate = asyncio.Semaphore(max_in_flight)
        self.random = random.Random(seed)
        self.nodes: dict[str, SimNode] = {}
        self.silenced: set[str] = set()
        self._next_index = 0
        # (method, resource, status code or error class) -> requests sent.
        self.requests: collections.Counter[tuple[str, str, str]] = collections.Counter()
        # Renewals that landed, per whole second of time.monotonic(): the write rate over any window.
        self.landed: collections.Counter[int] = collections.Counter()
        self.renewing = False

    async def close(self) -> None:
        await self.stop_renewing()
        await self.http.aclose()

    # -- nodes

    def _new_names(self, count: int) -> list[SimNode]:
        out = []
        for _ in range(count):
            i = self._next_index
            self._next_index += 1
            out.append(SimNode(f"{self.prefix}-{i:05d}", ZONES[i % len(ZONES)]))
        return out

    async def add(self, count: int) -> list[str]:
        """Create ``count`` more Node objects; they renew from now if the fleet is renewing."""
        new = self._new_names(count)
        await asyncio.gather(*(self._create_node(n) for n in new))
        for n in new:
            self.nodes[n.name] = n
            if self.renewing:
                self._start(n)
        return [n.name for n in new]

    async def remove(self, names: Iterable[str]) -> None:
        """Stop renewing and delete the Node objects (the aggregator deletes their leases)."""
        gone = [self.nodes.pop(name) for name in list(names) if name in self.nodes]
        for n in gone:
            if n.task is not None:
                n.task.cancel()
        await asyncio.gather(*(n.task for n in gone if n.task is not None), return_exceptions=True)
        await asyncio.gather(*(self._request("DELETE", "nodes", f"/api/v1/nodes/{n.name}") for n in gone))
        self.silenced -= {n.name for n in gone}

    async def _create_node(self, node: SimNode) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": {ZONE_LABEL: node.zone}},
        }
        response = await self._request("POST", "nodes", "/api/v1/nodes", json=body)
        if response is None or response.status_code not in (201, 409):
            code = "no answer" if response is None else f"{response.status_code} {response.text[:200]}"
            raise RuntimeError(f"creating node {node.name}: {code}")

    # -- renewing

    def start_renewing(self) -> None:
        self.renewing = True
        for n in self.nodes.values():
            if n.task is None:
                self._start(n)

    async def stop_renewing(self) -> None:
        self.renewing = False
        tasks = [n.task for n in self.nodes.values() if n.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for n in self.nodes.values():
            n.task = None

    def silence(self, names: Iterable[str]) -> None:
        self.silenced |= set(names) & set(self.nodes)

    def resume(self, names: Iterable[str] | None = None) -> None:
        self.silenced -= set(self.silenced if names is None else names)

    def _start(self, node: SimNode) -> None:
        node.task = asyncio.get_running_loop().create_task(self._agent(node), name=node.name)

    async def _agent(self, node: SimNode) -> None:
        loop = asyncio.get_running_loop()
        # DaemonSet pods start spread out: a random point of the first interval.
        next_at = loop.time() + self.random.uniform(0, node.interval_s)
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            started = loop.time()
            wait_s = await self._renew_once(node)
            # Fixed rate, as the agent schedules, but on the slots it was due at: each agent
            # wakes on time on its own node, while one loop that stalls (the benchmark's thread
            # holds the GIL) wakes them late together, and scheduling from then would put them
            # all in step for good. Slots a stall missed are skipped, not caught up in a burst.
            # A slow interval's wait aims at the node's own phase already.
            if node.interval_s < PHASED_FROM_S:
                next_at += wait_s * (math.floor(max(0.0, started - next_at) / wait_s) + 1)
            else:
                next_at = started + wait_s

    async def _renew_once(self, node: SimNode) -> float:
        if node.name in self.silenced:
            # A failed renewal: the agent tries again after its interval.
            return node.interval_s
        stamp = datetime.now(UTC)
        window_s = min(2 * node.interval_s, MAX_RENEWAL_WINDOW_S)
        response = await self._request(
            "PATCH",
            "leases",
            node_lease_path(self.namespace, node.name),
            content=json.dumps(renew_patch(node.name, stamp)).encode(),
            headers={"Content-Type": "application/merge-patch+json"},
            timeout=window_s,
        )
        misses, node.misses = node.misses, 0
        if response is not None and response.status_code == 404:
            node.misses = misses + 1
            return missing_wait_s(node.misses, node.interval_s, self.random.uniform(0.5, 1.0))
        if response is None or response.status_code != 200:
            if response is not None and response.status_code == 429:
                with contextlib.suppress(ValueError):
                    return max(float(response.headers.get("Retry-After", "0")), node.interval_s)
            # A failed renewal: the agent tries again after its interval.
            return node.interval_s
        node.renewals += 1
        node.last_renewed = time.monotonic()
        self.landed[int(node.last_renewed)] += 1
        self._adopt_interval(node, response)
        return next_renewal_in_s(node.name, node.interval_s, stamp.timestamp())

    @staticmethod
    def _adopt_interval(node: SimNode, response: httpx.Response) -> None:
        try:
            lease = response.json()
        except ValueError:
            return
        text = ((lease.get("metadata") or {}).get("annotations") or {}).get(RENEW_INTERVAL)
        if not text:
            return
        # The agent keeps its interval on a bad annotation too.
        with contextlib.suppress(ValueError):
            node.interval_s = min(max(parse_duration(text), MIN_RENEW_INTERVAL_S), MAX_RENEW_INTERVAL_S)

    async def _request(self, method: str, resource: str, path: str, **kw: Any) -> httpx.Response | None:
        async with self._gate:
            try:
                response = await self.http.request(method, path, **kw)
            except httpx.HTTPError as e:
                self.requests[(method, resource, type(e).__name__)] += 1
                return None
        self.requests[(method, resource, str(response.status_code))] += 1
        return response

    # -- what it did

    def sent(self, method: str | None = None, resource: str | None = None, code: str | None = None) -> int:
        return sum(
            v
            for (m, r, c), v in self.requests.items()
            if (method is None or m == method)
            and (resource is None or r == resource)
            and (code is None or c == code)
        )

    def intervals(self) -> collections.Counter[float]:
        return collections.Counter(n.interval_s for n in self.nodes.values())

    def renewed_within(self, seconds: float) -> list[str]:
        now = time.monotonic()
        return [n.name for n in self.nodes.values() if n.renewals and now - n.last_renewed <= seconds]

    def zones(self) -> dict[str, str]:
        return {n.name: n.zone for n in self.nodes.values()}

    def at_interval(self, seconds: float) -> frozenset[str]:
        """The nodes renewing at ``seconds`` as their own lease's answer asks: at the fast
        interval, the sample as the aggregator hands it out (drawn per zone, rotating)."""
        return frozenset(n.name for n in self.nodes.values() if n.interval_s == seconds)

    def in_zones(self, zones: Iterable[str]) -> list[str]:
        wanted = set(zones)
        return [n.name for n in self.nodes.values() if n.zone in wanted]


class FleetThread:
    """A Fleet on its own event loop in a thread, driven from synchronous code."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        # uvloop where it is installed: the simulator's own CPU is CPU the API server lacks.
        try:
            import uvloop  # noqa: PLC0415

            self._loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fleet", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Awaitable[T]], timeout_s: float = 600.0) -> T:
        async def run() -> T:
            return await fn()

        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(timeout_s)

    def read(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the fleet's loop: its counters and nodes change under a reader in
        another thread."""

        async def run() -> T:
            return fn()

        return self.call(run)

    def add(self, count: int) -> list[str]:
        return self.call(lambda: self.fleet.add(count))

    def remove(self, names: Iterable[str]) -> None:
        names = list(names)
        self.call(lambda: self.fleet.remove(names))

    def start_renewing(self) -> None:
        self.read(self.fleet.start_renewing)

    def silence(self, names: Iterable[str]) -> None:
        self._loop.call_soon_threadsafe(self.fleet.silence, list(names))

    def resume(self, names: Iterable[str] | None = None) -> None:
        self._loop.call_soon_threadsafe(self.fleet.resume, None if names is None else list(names))

    def sent(self, method: str | None = None, resource: str | None = None, code: str | None = None) -> int:
        return self.read(lambda: self.fleet.sent(method, resource, code))

    def zones(self) -> dict[str, str]:
        return self.read(self.fleet.zones)

    def at_interval(self, seconds: float) -> frozenset[str]:
        return self.read(lambda: self.fleet.at_interval(seconds))

    def landed(self, start: float, end: float) -> list[int]:
        """Renewals landed in each whole second from ``start`` to ``end`` (time.monotonic())."""
        return self.read(lambda: [self.fleet.landed[t] for t in range(math.ceil(start), math.floor(end))])

    def requests(self) -> dict[tuple[str, str, str], int]:
        return self.read(lambda: dict(self.fleet.requests))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self.fleet.close, 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
