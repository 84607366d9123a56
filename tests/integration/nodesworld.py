"""The demo's nodes on the test clock: per node a real agent process and a real kubelet
(kubemark's hollow node), both reaching the shoot's KAPI through one load balancer
(``TcpProxy``) under its name, so a cut silences both; the aggregator as its own process,
reaching KAPI directly as from the seed. The aggregator's clock is the test clock (a 2 s
lease); the kubelet's is its own (every 10 s): the second witness waits for it, as it must at
any setting.

Lighter than the demo: no KCM processes (the seed's controllers are Deployment objects whose
status a driver copies), a fresh shoot per test in the shared seed (``Shoot``).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from core.lease import DEFAULT_LEASE_NAMESPACE, parse_micro_time
from testenv.base.process import Process
from testenv.base.wait import wait_for
from testenv.kube.controllers import DOWN
from testenv.kube.controlplane import free_port
from testenv.kube.hollow import HollowKubelet, renewals, running
from testenv.kube.standins import AGENT_SA
from testenv.net.tcpproxy import TcpProxy
from testenv.net.webhook import FailingWebhook
from testenv.worlds.agents import Agents, agents_for
from testenv.worlds.shoot_world import FAST_ENV, Shoot
from tests.alerting import scrape
from tests.integration.dwdworld import NODES

LEASE_DURATION_S = float(FAST_ENV["DWD_LEASE_DURATION"].rstrip("s"))
RECOVERY_PERIOD_S = float(FAST_ENV["DWD_RECOVERY_PERIOD"].rstrip("s"))
ROLEBINDING = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{DEFAULT_LEASE_NAMESPACE}/rolebindings"

__all__ = ["DOWN", "NODES", "NodesWorld", "PhaseChange", "nodes_world"]


@dataclass(frozen=True)
class PhaseChange:
    at: float  # time.time(), from the aggregator's log
    phase: str
    reason: str


@dataclass
class NodesWorld:
    shoot: Shoot
    agents: Agents
    lb: TcpProxy
    kubelets: Sequence[HollowKubelet]
    webhook: FailingWebhook
    procs: list[Process] = field(default_factory=list)
    aggregator: Process | None = None
    metrics_port: int = 0

    def start(self) -> NodesWorld:
        """Agents and aggregator started; returns once the aggregator judged every node healthy."""
        # The aggregator first: it creates the agents' leases, and an agent that finds none backs off.
        self.metrics_port = free_port()
        self.aggregator = self.shoot.start_aggregator({"DWD_METRICS_ADDR": f"127.0.0.1:{self.metrics_port}"})
        self.procs = [self.start_agent(n) for n in NODES]
        wait_for(lambda: self.lease_ages_s() and max(self.lease_ages_s()) < 1, 60, "every agent renewing")
        wait_for(lambda: self.phases()[-1:] == ["healthy"], 30, "a healthy verdict", every_s=0.2)
        return self

    def start_agent(self, node: str) -> Process:
        """``node``'s agent, reaching KAPI through the load balancer as its kubelet does (a
        DaemonSet's successor pod is started the same way)."""
        return self.agents.start(self.agents.env(node, DWD_APISERVER_URL=f"https://localhost:{self.lb.port}"))

    # --- what is observed ---------------------------------------------------------------------

    def lease_ages_s(self) -> list[float]:
        """How long ago each agent's lease was renewed, by the node's clock (this machine's)."""
        now = datetime.now(UTC)
        renewed = [x["spec"].get("renewTime") for x in self.shoot.leases().values()]
        if len(renewed) < len(NODES) or not all(renewed):
            return []
        return [(now - parse_micro_time(r)).total_seconds() for r in renewed]

    def phases(self) -> list[str]:
        return [p.phase for p in self.phase_changes()]

    def phase_changes(self) -> list[PhaseChange]:
        assert self.aggregator is not None
        return [
            PhaseChange(datetime.fromisoformat(e["timestamp"]).timestamp(), e["phase"], e.get("reason", ""))
            for e in self.aggregator.events()
            if e.get("event") == "target_phase"
        ]

    def entered(self, phase: str, after: float) -> PhaseChange | None:
        """The aggregator's first move to ``phase`` after ``after`` (time.time())."""
        return next((p for p in self.phase_changes() if p.phase == phase and p.at > after), None)

    def agents_failing(self, failure: str) -> bool:
        """Every agent has logged that its renewals fail with ``failure`` (its failure class)."""
        return all(
            any(e.get("event") == "renew_failing" and e.get("failure") == failure for e in p.events())
            for p in self.procs
        )

    def kubelet_renewals(self) -> dict[str, float]:
        """Each kubelet's last lease renewal (time.time())."""
        for k in self.kubelets:
            assert k.alive(), k.tail()
        return renewals(self.shoot.shoot_admin, NODES)

    def kubelets_renewed_after(self, wall: float) -> bool:
        renewed = self.kubelet_renewals()
        return len(renewed) == len(NODES) and min(renewed.values()) > wall

    def metrics(self) -> str:
        """The aggregator's /metrics, as Prometheus scrapes it."""
        return scrape(self.metrics_port)

    def event_reasons(self) -> list[str]:
        return [str(e.get("reason")) for e in self.shoot.events()]

    # --- what breaks --------------------------------------------------------------------------

    def cut(self) -> None:
        """The path: no node reaches KAPI, KAPI itself is fine."""
        self.lb.close()

    def heal(self) -> None:
        self.lb.open()

    def forbid_agents(self) -> None:
        """The agents' RoleBinding pruned: every renewal is answered 403."""
        self.shoot.shoot_admin.delete(f"{ROLEBINDING}/{AGENT_SA}")

    def break_admission(self) -> None:
        """A webhook for our leases whose backend fails: every renewal is a 500."""
        self.webhook.register(self.shoot.shoot_admin, DEFAULT_LEASE_NAMESPACE)

    def kill_agents(self) -> None:
        """Every agent SIGKILLed at once (an OOM kill on every node): nothing releases a lease."""
        for p in self.procs:
            p.popen.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.popen.wait(10)


@contextlib.contextmanager
def nodes_world(shoot: Shoot) -> Iterator[NodesWorld]:
    shoot.setup(nodes=0)  # the kubelets register the nodes; no lease driver: real agents renew
    cp = shoot.shoot
    assert cp.ca is not None
    lb = TcpProxy(upstream=("127.0.0.1", int(cp.url.rsplit(":", 1)[1]))).open()
    webhook = FailingWebhook(shoot.tmp / "webhook").open()
    kubelets = [
        HollowKubelet(n, cp, shoot.tmp / "kubelets", server=f"https://localhost:{lb.port}") for n in NODES
    ]
    with agents_for(cp, shoot.tmp) as agents, running(kubelets):
        try:
            # Only the kubelets' writes so far: the aggregator has not provisioned the agents' leases.
            # A kubelet's first lease waits for a pass of its lease controller after it registered.
            started = time.time()
            world = NodesWorld(shoot, agents, lb, kubelets, webhook)
            wait_for(lambda: world.kubelets_renewed_after(started), 60, "every kubelet renewing", every_s=0.5)
            yield world
        finally:
            webhook.shutdown()
            lb.shutdown()
