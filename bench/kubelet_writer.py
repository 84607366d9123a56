"""N kubelets' node leases renewed at the kubelet's pace, in a process of their own.

``python -m bench.kubelet_writer URL CA CERT KEY --nodes N --interval-s 10 --stats FILE``

Run apart from the benchmark so that the benchmark's own CPU time is the reader's alone
(what the aggregator would spend), not the writer's. Like kubelet's node-lease controller
each renewal is a PUT of the whole Lease as last returned, with a new renewTime; node i
renews at i/N of every interval, so the writes are spread evenly (N/interval per second).
Kubelets hold one connection each; this writer multiplexes all of them over 64 HTTP/1.1
connections (aiohttp; 16 could not carry 500/s), so KAPI's per-connection cost is missing.

Like kubelet, a node's next renewal waits until its last one has ended: when KAPI (or this
writer) cannot keep up, renewals are skipped rather than piled up. Every second it appends
a JSON line to FILE: renewals answered 200 in that second, errors, renewals skipped,
requests in flight (the backlog), and the latency p50/p99 of that second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import ssl
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import aiohttp
import uvloop

from bench.stats import nearest_rank
from core.lease import format_micro_time, lease_path, leases_path

NAMESPACE = "kube-node-lease"
# kubelet's nodeLeaseDurationSeconds.
KUBELET_LEASE_DURATION_S = 40
KUBELET_RENEW_INTERVAL_S = 10.0


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def kubelet_lease(name: str) -> dict[str, Any]:
    """A Lease as kubelet creates it: owned by its Node, held by the node's name."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": f"00000000-0000-4000-8000-{int(name.rsplit('-', 1)[1]):012d}",
                }
            ],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": KUBELET_LEASE_DURATION_S,
            "renewTime": format_micro_time(datetime.now(UTC)),
        },
    }


class Writer:
    def __init__(
        self, url: str, tls: ssl.SSLContext, nodes: int, interval_s: float, connections: int
    ) -> None:
        self.url = url.rstrip("/")
        self.tls = tls
        self.nodes = nodes
        self.interval_s = interval_s
        self.connections = connections
        self.leases: dict[str, dict[str, Any]] = {}
        self.ok = 0
        self.errors = 0
        self.waiting = 0
        self.skipped = 0
        self.in_flight: set[str] = set()
        self.latencies: list[float] = []

    async def ensure(self, session: aiohttp.ClientSession) -> None:
        """Every lease created (or, when it exists, read) once, 32 at a time."""
        gate = asyncio.Semaphore(32)

        async def one(name: str) -> None:
            async with gate:
                body = json.dumps(kubelet_lease(name)).encode()
                async with session.post(self.url + leases_path(NAMESPACE), data=body) as r:
                    if r.status == 409:
                        async with session.get(self.url + lease_path(NAMESPACE, name)) as g:
                            self.leases[name] = await g.json()
                        return
                    if r.status >= 300:
                        raise RuntimeError(f"create {name}: {r.status} {await r.text()}")
                    self.leases[name] = await r.json()

        await asyncio.gather(*(one(node_name(i)) for i in range(self.nodes)))

    async def renew(self, session: aiohttp.ClientSession, name: str) -> None:
        lease = self.leases[name]
        lease["spec"]["renewTime"] = format_micro_time(datetime.now(UTC))
        self.waiting += 1
        t0 = time.perf_counter()
        try:
            async with session.put(self.url + lease_path(NAMESPACE, name), data=json.dumps(lease)) as r:
                payload = await r.read()
                if r.status == 200:
                    self.leases[name] = json.loads(payload)
                    self.ok += 1
                    self.latencies.append(time.perf_counter() - t0)
                else:
                    self.errors += 1
        except (aiohttp.ClientError, TimeoutError):
            self.errors += 1
        finally:
            self.waiting -= 1
            self.in_flight.discard(name)

    def _issue(
        self, session: aiohttp.ClientSession, names: list[str], issued: int, due: int
    ) -> list[asyncio.Task[None]]:
        """Renewals ``issued`` to ``due`` (of ``names``, round and round), but none for a
        node whose last one is still in flight: like kubelet, it waits for that to end."""
        started = []
        for k in range(issued, due):
            name = names[k % self.nodes]
            if name in self.in_flight:
                self.skipped += 1
                continue
            self.in_flight.add(name)
            started.append(asyncio.create_task(self.renew(session, name)))
        return started

    def _report(self, out: IO[str], t: float) -> None:
        """The last second's counts, as a line of ``out``; the counts start again."""
        line = {
            "t": round(t, 2),
            "ok": self.ok,
            "errors": self.errors,
            "waiting": self.waiting,
            "skipped": self.skipped,
            "p50_ms": round(nearest_rank(self.latencies, 0.5) * 1000, 1),
            "p99_ms": round(nearest_rank(self.latencies, 0.99) * 1000, 1),
        }
        out.write(json.dumps(line) + "\n")
        out.flush()
        self.ok, self.errors, self.skipped, self.latencies = 0, 0, 0, []

    async def _write(self, session: aiohttp.ClientSession, out: IO[str], stop: asyncio.Event) -> None:
        names = [node_name(i) for i in range(self.nodes)]
        rate = self.nodes / self.interval_s
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        issued = 0
        second = start
        while not stop.is_set():
            now = time.monotonic()
            due = int((now - start) * rate)
            if due - issued > rate:
                # More than a second behind (stopped, or starved of CPU): kubelet would
                # not catch up with renewals it missed either.
                self.skipped += due - issued - int(rate)
                issued = due - int(rate)
            for task in self._issue(session, names, issued, due):
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            issued = max(issued, due)
            if now - second >= 1.0:
                self._report(out, now - start)
                second += 1.0
            await asyncio.sleep(0.01)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run(self, stats: Path, stop: asyncio.Event) -> None:
        connector = aiohttp.TCPConnector(ssl=self.tls, limit=self.connections)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        async with aiohttp.ClientSession(
            connector=connector, headers=headers, trust_env=False, timeout=aiohttp.ClientTimeout(total=30)
        ) as session:
            await self.ensure(session)
            with stats.open("a") as out:
                out.write(json.dumps({"ready": True, "leases": len(self.leases)}) + "\n")
                out.flush()
                await self._write(session, out, stop)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.kubelet_writer")
    parser.add_argument("url")
    parser.add_argument("ca")
    parser.add_argument("cert")
    parser.add_argument("key")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--interval-s", type=float, default=KUBELET_RENEW_INTERVAL_S)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--stats", required=True)
    args = parser.parse_args(argv)
    tls = ssl.create_default_context(cafile=args.ca)
    tls.load_cert_chain(args.cert, args.key)
    writer = Writer(args.url, tls, args.nodes, args.interval_s, args.connections)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await writer.run(Path(args.stats), stop)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


if __name__ == "__main__":
    main()
