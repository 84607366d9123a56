"""The fault suite's rig: a real shoot and seed, ten nodes whose agents' and kubelets' leases
drivers renew, and two aggregator replicas with leader election, each reaching the seed
through its own FaultProxy; on demand, dependency-watchdog's prober beside them.

One proxy per replica, so one replica's seed path can be blackholed while the
other's works. A sampler reads the controllers straight from the seed (not
through a proxy) every 100 ms: whatever the aggregators did, even briefly, is
seen. A journal keeps what the suite did, with wall-clock times to line up with
the aggregators' JSON logs.

The kubelet leases are what dependency-watchdog judges: a cut silences a node's
agent and its kubelet together, as a broken path would.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml

from aggregator.model.records import RECORD
from core.errors import KubeError
from core.lease import PREFIX, leases_path
from testenv.base.process import Process
from testenv.base.wait import eventually, wait_for
from testenv.gardener.prober_standin import NODE_LEASE_NAMESPACE, ProberStandIn
from testenv.kube.controllers import CONTROLLERS, MCM
from testenv.kube.controlplane import ControlPlane, free_port
from testenv.kube.standins import DEPLOYMENTS, NodeLeaseDriver
from testenv.net.faultproxy import FaultProxy
from testenv.worlds.aggregators import start_aggregator
from testenv.worlds.shoot_world import FAST_DEPENDENTS, Sample, Sampler, Shoot, shoot_for

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
# The tests' dependents, but MCM comes up 5 s after KCM (Gardener's is 30 s): a window in
# which KCM runs again while MCM and CA are still at 0 with our record, for restarts to hit.
MCM_UP_DELAY = "5s"
DEPENDENTS_FILE = "dependents-faults.yaml"
# dependency-watchdog's own clocks, in Gardener's proportions: a kubelet lease counts as
# expired 30 s after its renewal (0.75 x KCM's 40 s grace), far beyond the suite's 4-15 s
# outages, so its verdict is always "scale-up" and every dependent it finds at 0 it raises
# to the ``replicas`` annotation, i.e. to what the aggregator holds down. Probes 3-3.6 s
# apart (Gardener's 30 s, against outages of minutes), so that an outage here sees one or
# more; each shoot request bounded by the interval.
DWD_SETTINGS: dict[str, Any] = {
    "kcm_grace_s": 40.0,
    "probe_interval_s": 3.0,
    "jitter": 0.2,
    "initial_delay_s": 0.0,
    "probe_timeout_s": 3.0,
}
# kubelet renews every 10 s; 1 s follows a restore as closely as the agents do, and a
# fresher lease only widens the margin to dependency-watchdog's 30 s.
KUBELET_RENEW_S = 1.0


def dependents() -> dict[str, Any]:
    """The rig's dependents, for the aggregators' file and dependency-watchdog alike."""
    config: dict[str, Any] = copy.deepcopy(FAST_DEPENDENTS)
    for info in config["dependentResourceInfos"]:
        if info["ref"]["name"] == MCM:
            info["scaleUp"]["initialDelay"] = MCM_UP_DELAY
    return config


def wall(t: float | None = None) -> str:
    """Now, or the monotonic moment ``t``, as the UTC wall clock the JSON logs use."""
    now = datetime.now(UTC)
    if t is not None:
        now -= timedelta(seconds=time.monotonic() - t)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Journal:
    """What the suite did and when, to a file and, per cycle, in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self.lines: list[str] = []

    def __call__(self, text: str, at: float | None = None) -> None:
        """``at``: the monotonic moment it happened, when written down later (another writer's
        record, read when it stops)."""
        line = f"{wall(at)} {text}"
        with self._lock:
            self.lines.append(line)
            self._file.write(line + "\n")

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)

    def since(self, mark: int) -> list[str]:
        """In the order things happened: lines written down later take their place."""
        with self._lock:
            return sorted(self.lines[mark:], key=lambda line: line.split(" ", 1)[0])

    def close(self) -> None:
        self._file.close()


def recorded(s: Sample) -> frozenset[str]:
    """The controllers that carry our record (its annotation or its label): held down by us."""
    return frozenset(
        n for n in s.replicas if RECORD in s.annotations.get(n, {}) or RECORD in s.labels.get(n, {})
    )


def annotated(s: Sample) -> frozenset[str]:
    """The controllers that carry any mark of a scale-down: ours (not under dependency-watchdog's
    prefix, so counted on its own), or dependency-watchdog's keys."""
    marked = {n for n, keys in s.annotations.items() if any(k.startswith(PREFIX) for k in keys)}
    return recorded(s) | marked


@dataclass
class Replica:
    """One aggregator replica's slot: its proxy and status port stay, its process may be replaced."""

    slot: int
    proxy: FaultProxy
    kubeconfig: Path
    port: int = field(default_factory=free_port)
    process: Process | None = None
    starts: int = 0
    _identity: str = ""

    @property
    def name(self) -> str:
        return f"aggregator-{self.slot}"

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

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
    def __init__(
        self,
        shoot: Shoot,
        kubelets: NodeLeaseDriver,
        replicas: list[Replica],
        sampler: Sampler,
        journal: Journal,
    ) -> None:
        self.shoot = shoot
        self.kubelets = kubelets
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
        """Their agents and their kubelets stop renewing, together."""
        # New sets, never mutated in place: the driver threads iterate them.
        self.shoot.driver.alive = set(NODES) - nodes
        self.kubelets.alive = set(NODES) - nodes

    def restore_nodes(self) -> None:
        self.shoot.driver.alive = set(NODES)
        self.kubelets.alive = set(NODES)

    # -- the other writers

    def scale(self, name: str, replicas: int, who: str) -> None:
        """Sets a controller's scale as ``kubectl scale`` does: no precondition, last writer wins."""
        self.shoot.seed_admin.merge_patch(
            f"{DEPLOYMENTS.format(ns=NAMESPACE)}/{name}/scale", {"spec": {"replicas": replicas}}
        )
        self.journal(f"{who}: scaled {name} to {replicas}")

    @contextlib.contextmanager
    def watchdog(self) -> Iterator[ProberStandIn]:
        """dependency-watchdog's prober, probing from now until the block ends, on clients of
        its own (it shares none of the suite's connections, as the real one would not)."""
        with self.shoot.shoot.admin_client() as shoot, self.shoot.seed.admin_client() as seed:
            dwd = ProberStandIn(shoot, seed, NAMESPACE, dependents=dependents(), **DWD_SETTINGS)
            dwd.start()
            self.journal("dependency-watchdog started")
            try:
                yield dwd
            finally:
                dwd.stop()
                self.journal(f"dependency-watchdog stopped after {len(dwd.probes)} probes")

    # -- the replicas

    def start(self, r: Replica) -> None:
        with self._lock:
            if r.alive():
                return
            r.starts += 1
            log_path = self.workdir / f"{r.name}.{r.starts}.log"
            env = self.shoot.env(
                {
                    **LEADER_ENV,
                    "DWD_METRICS_ADDR": f"127.0.0.1:{r.port}",
                    "DWD_DEPENDENTS_FILE": str(self.workdir / DEPENDENTS_FILE),
                }
            )
            r.process = start_aggregator(
                env,
                name=r.name,
                log_path=log_path,
                shoot_kubeconfig=self.shoot.shoot.kubeconfig,
                seed_kubeconfig=r.kubeconfig,
                namespace=self.shoot.namespace,
            )
            r._identity = ""
            self.journal(f"started {r.name} (pid {r.process.pid}, log {log_path.name})")

    def kill(self, r: Replica) -> None:
        with self._lock:
            if r.process is not None and r.alive():
                r.process.kill()
                self.journal(f"SIGKILLed {r.name} (pid {r.process.pid})")

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

    def settled(self, want: dict[str, int] = CONTROLLERS) -> bool:
        """The controllers at ``want`` (their replicas, unless an operator chose other counts)
        without a record, and both replicas healthy with one leader between them: the next
        cycle starts from where the first one did."""
        sample = self.sampler.latest()
        if sample is None or sample.replicas != want or annotated(sample):
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
        if sample and annotated(sample):
            parts.append(f"annotated {sorted(annotated(sample))}")
        for r in self.replicas:
            s = r.status()
            alive = "alive" if r.alive() else "dead"
            parts.append(
                f"{r.name} {alive} leader={s.get('leader') if s else '?'} phase={_phase(s) if s else '?'}"
            )
        return "; ".join(parts)

    def wait_leader(self, timeout_s: float) -> Replica:
        leader: Replica = wait_for(self.leader, timeout_s, "an aggregator replica to lead", 0.1, TimeoutError)
        return leader


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
        (workdir / DEPENDENTS_FILE).write_text(yaml.safe_dump(dependents()))
        kubelets = NodeLeaseDriver(shoot.shoot.admin_client(), NODES, every_s=KUBELET_RENEW_S)
        kubelets.start()
        stack.callback(kubelets.stop)
        replicas = []
        for slot in range(2):
            proxy = FaultProxy(seed).open()
            stack.callback(proxy.shutdown)
            replicas.append(Replica(slot, proxy, proxy.kubeconfig(workdir / f"seed-via-proxy-{slot}.yaml")))
        sampler = Sampler(seed.admin_client(), NAMESPACE)
        sampler.start()
        stack.callback(sampler.stop)
        r = Rig(shoot, kubelets, replicas, sampler, journal)
        stack.callback(_kill_all, r)
        for replica in replicas:
            r.start(replica)
        r.wait_leader(60)
        shoot.wait_leases_renewed(60)
        if not eventually(lambda: _kubelet_leases(shoot) == len(NODES), 60):
            raise TimeoutError("the kubelet leases were not all created within 60s")
        try:
            wait_for(r.settled, 60, "the rig to settle", every_s=0.2, error=TimeoutError)
        except TimeoutError:
            raise TimeoutError(f"the rig did not settle: {r.describe()}") from None
        journal("rig settled")
        yield r


def _kubelet_leases(shoot: Shoot) -> int:
    items = shoot.shoot_admin.get(leases_path(NODE_LEASE_NAMESPACE))["items"]
    return sum(1 for x in items if (x.get("spec") or {}).get("renewTime"))


def _kill_all(r: Rig) -> None:
    for replica in r.replicas:
        if replica.process is not None:
            replica.process.kill()
