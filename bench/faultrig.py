"""The fault suite's rig: a real shoot and seed, ten nodes renewed by a driver, and two
aggregator replicas with leader election, each reaching the seed through its own FaultProxy.

One proxy per replica, so one replica's seed path can be blackholed while the
other's works. A sampler reads the controllers straight from the seed (not
through a proxy) every 100 ms: whatever the aggregators did, even briefly, is
seen. A journal keeps what the suite did, with wall-clock times to line up with
the aggregators' JSON logs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import httpx

from core.errors import KubeError
from core.lease import PREFIX
from testenv.controlplane import ControlPlane, free_port
from testenv.faultproxy import FaultProxy
from testenv.standins import CONTROLLERS, DEPLOYMENTS, LoggedProcess
from tests.integration.shoot import Shoot, shoot_for

NAMESPACE = "shoot--faults--suite"
NODES = [f"node-{i}" for i in range(10)]
LEADER_LEASE = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/dwd-lease-aggregator"
# Short, but in client-go's order: a deposed leader stops writing (2 s without a
# renewal) before a standby may take over (3 s without seeing one).
LEADER_ENV = {
    "DWD_LEADER_ELECTION": "true",
    "DWD_LEADER_ELECTION_NAMESPACE": NAMESPACE,
    "DWD_LEADER_LEASE_DURATION": "3s",
    "DWD_LEADER_RENEW_DEADLINE": "2s",
    "DWD_LEADER_RETRY_PERIOD": "500ms",
}


def wall() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Journal:
    """What the suite did and when, to a file and, per cycle, in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self.lines: list[str] = []

    def __call__(self, text: str) -> None:
        line = f"{wall()} {text}"
        with self._lock:
            self.lines.append(line)
            self._file.write(line + "\n")

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return self.lines[mark:]

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class Sample:
    t: float  # monotonic
    replicas: dict[str, int]
    # The controllers that carry any dependency-watchdog annotation.
    annotated: frozenset[str]


class Sampler(threading.Thread):
    """Reads the controllers' spec.replicas and annotations from the seed every ``every_s``."""

    def __init__(self, seed: ControlPlane, namespace: str, every_s: float = 0.1) -> None:
        super().__init__(name="sampler", daemon=True)
        self.client = seed.admin_client()
        self.path = DEPLOYMENTS.format(ns=namespace)
        self.every_s = every_s
        self.halt = threading.Event()
        self.samples: list[Sample] = []
        self.errors = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            try:
                items = self.client.get(self.path)["items"]
            except (KubeError, OSError, httpx.HTTPError):
                self.errors += 1
            else:
                sample = Sample(
                    started,
                    {d["metadata"]["name"]: d["spec"].get("replicas", 1) for d in items},
                    frozenset(
                        d["metadata"]["name"]
                        for d in items
                        if any(k.startswith(PREFIX) for k in d["metadata"].get("annotations") or {})
                    ),
                )
                with self._lock:
                    self.samples.append(sample)
            self.halt.wait(max(0.0, self.every_s - (time.monotonic() - started)))

    def between(self, t0: float, t1: float = float("inf")) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if t0 <= s.t <= t1]

    def latest(self) -> Sample | None:
        with self._lock:
            return self.samples[-1] if self.samples else None

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        self.client.close()


@dataclass
class Replica:
    """One aggregator replica's slot: its proxy and status port stay, its process may be replaced."""

    slot: int
    proxy: FaultProxy
    kubeconfig: Path
    port: int = field(default_factory=free_port)
    process: LoggedProcess | None = None
    starts: int = 0
    _identity: str = ""

    @property
    def name(self) -> str:
        return f"aggregator-{self.slot}"

    def alive(self) -> bool:
        return self.process is not None and self.process.popen.poll() is None

    def identity(self) -> str:
        """Its leader-election identity, from its start-up log line."""
        if not self._identity and self.process is not None:
            for e in self.process.events():
                if e.get("event") == "aggregator_started":
                    self._identity = str(e.get("identity") or "")
        return self._identity

    def status(self) -> dict[str, Any] | None:
        try:
            response = httpx.get(f"http://127.0.0.1:{self.port}/status", trust_env=False, timeout=1)
            result: dict[str, Any] = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        return result

    def logs(self, workdir: Path) -> list[Path]:
        return sorted(workdir.glob(f"{self.name}.*.log"))


class Rig:
    def __init__(self, shoot: Shoot, replicas: list[Replica], sampler: Sampler, journal: Journal) -> None:
        self.shoot = shoot
        self.replicas = replicas
        self.sampler = sampler
        self.journal = journal
        # Kills and restarts come from the main thread and the chaos thread.
        self._lock = threading.RLock()
        self.driver_paused = False

    @property
    def workdir(self) -> Path:
        return self.shoot.tmp

    # -- the nodes

    def cut(self, nodes: frozenset[str]) -> None:
        # A new set, never mutated in place: the driver thread iterates it.
        self.shoot.driver.alive = set(NODES) - nodes

    def restore_nodes(self) -> None:
        self.shoot.driver.alive = set(NODES)

    # -- the replicas

    def start(self, r: Replica) -> None:
        with self._lock:
            if r.alive():
                return
            r.starts += 1
            log_path = self.workdir / f"{r.name}.{r.starts}.log"
            env = self.shoot.env(
                **LEADER_ENV,
                DWD_SEED_KUBECONFIG=str(r.kubeconfig),
                DWD_METRICS_ADDR=f"127.0.0.1:{r.port}",
            )
            with open(log_path, "wb") as log:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "aggregator"], env=env, stdout=log, stderr=log
                )
            r.process, r._identity = LoggedProcess(popen, log_path), ""
            self.journal(f"started {r.name} (pid {popen.pid}, log {log_path.name})")

    def kill(self, r: Replica) -> None:
        with self._lock:
            if r.process is not None and r.alive():
                r.process.kill()
                self.journal(f"SIGKILLed {r.name} (pid {r.process.popen.pid})")

    def leader(self) -> Replica | None:
        """The live replica that holds the leader lease in the seed."""
        try:
            lease = self.shoot.seed_admin.get(LEADER_LEASE.format(ns=NAMESPACE))
        except (KubeError, OSError, httpx.HTTPError):
            return None
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        with self._lock:
            for r in self.replicas:
                if holder and r.alive() and r.identity() == holder:
                    return r
        return None

    # -- the whole

    def heal(self) -> None:
        """Everything back: every node renews, both seed paths work, both replicas run."""
        self.restore_nodes()
        for r in self.replicas:
            r.proxy.clear()
            r.proxy.blackhole(False)
            self.start(r)

    def settled(self) -> bool:
        """The controllers at their replicas without a record, and both replicas healthy with
        one leader between them: the next cycle starts from where the first one did."""
        sample = self.sampler.latest()
        if sample is None or sample.replicas != CONTROLLERS or sample.annotated:
            return False
        statuses = [r.status() for r in self.replicas]
        if any(s is None for s in statuses) or not all(r.alive() for r in self.replicas):
            return False
        leaders = [s for s in statuses if s and s.get("leader")]
        phases = [_phase(s) for s in statuses if s]
        return len(leaders) == 1 and phases == ["healthy"] * len(self.replicas)

    def describe(self) -> str:
        """The state, in one line: for a cycle that did not settle."""
        sample = self.sampler.latest()
        parts = [f"replicas {sample.replicas if sample else '?'}"]
        if sample and sample.annotated:
            parts.append(f"annotated {sorted(sample.annotated)}")
        for r in self.replicas:
            s = r.status()
            alive = "alive" if r.alive() else "dead"
            parts.append(
                f"{r.name} {alive} leader={s.get('leader') if s else '?'} phase={_phase(s) if s else '?'}"
            )
        return "; ".join(parts)

    def wait_leader(self, timeout_s: float) -> Replica:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.1)
        raise TimeoutError(f"no aggregator replica led within {timeout_s:.0f}s")


def _phase(status: dict[str, Any]) -> str:
    targets = status.get("targets") or []
    return str(targets[0].get("phase")) if targets else "none"


@contextlib.contextmanager
def rig(workdir: Path) -> Iterator[Rig]:
    """The rig, up and settled; everything it started is stopped on the way out, Ctrl-C included."""
    journal = Journal(workdir / "faults.log")
    with contextlib.ExitStack() as stack:
        stack.callback(journal.close)
        journal(f"starting the seed and the shoot control planes; logs in {workdir}")
        seed = stack.enter_context(ControlPlane().running())
        shoot = stack.enter_context(shoot_for(seed, NAMESPACE, workdir))
        shoot.setup(nodes=len(NODES))
        replicas = []
        for slot in range(2):
            proxy = FaultProxy(seed).open()
            stack.callback(proxy.shutdown)
            replicas.append(Replica(slot, proxy, proxy.kubeconfig(workdir / f"seed-via-proxy-{slot}.yaml")))
        sampler = Sampler(seed, NAMESPACE)
        sampler.start()
        stack.callback(sampler.stop)
        r = Rig(shoot, replicas, sampler, journal)
        stack.callback(_kill_all, r)
        for replica in replicas:
            r.start(replica)
        r.wait_leader(60)
        shoot.wait_leases_renewed(60)
        deadline = time.monotonic() + 60
        while not r.settled():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the rig did not settle: {r.describe()}")
            time.sleep(0.2)
        journal("rig settled")
        yield r


def _kill_all(r: Rig) -> None:
    for replica in r.replicas:
        if replica.process is not None:
            replica.process.kill()
