"""The aggregator's world in memory, for the stateful model (tests/model/machine.py).

One shoot and its seed as fake API servers (tests/unit/fakekube.py), a manual clock, and
everything that writes them besides the aggregator, played by the world: each node's agent
and kubelet (renewing at their own phase, on the node's own clock, while the node's path, its
agent and its kubelet work), gardenlet (hibernation, migration), dependency-watchdog and
operators. The aggregator itself is real: per replica a Target, a LeaderElector and the
Orphans sweep, wired as the Fleet wires them, each reaching the seed through a ``Link`` that
can be cut off, hold writes past their caller's patience (they land when the world says so),
or answer with faults.

The world keeps the truth the invariants are checked against (``Truth``): since when each
node's kubelet could renew, what every writer wanted each controller at, what the aggregator
wrote and when.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

from aggregator.act.orphans import Orphans
from aggregator.lead.leader import LeaderElector
from aggregator.model.dependents import DEFAULT_DEPENDENTS
from aggregator.model.eligibility import candidates
from aggregator.model.lifecycle import Lifecycle
from aggregator.model.observed import KUBELET_JITTER, NODE_LEASE_NAMESPACE
from aggregator.model.records import MELTDOWN, RECORD, REPLICAS
from aggregator.model.settings import LeaderSettings, Settings, ShootSettings
from aggregator.observe.seeddependents import SeedDependents
from aggregator.ops.looplag import LoopLag
from aggregator.ops.metrics import AggregatorMetrics
from aggregator.shoot import Shared
from aggregator.target import Target
from core.errors import Conflict, KubeError, TransportError, api_error
from core.lease import (
    DEFAULT_LEASE_NAMESPACE,
    LEGACY_LEASE_NAMESPACE,
    RELEASED,
    RENEW_INTERVAL,
    format_micro_time,
    lease_metadata,
    lease_path,
    node_lease_path,
)
from testenv.gardener.seed_objects import cluster
from testenv.kube.controllers import CA, CONTROLLERS
from tests.unit.fakekube import FakeKube, managed

NS = "shoot--p--s"
WALL0 = 1_796_000_000.0
LEADER_NS = "garden"
RENEW_FIELDS: dict[str, Any] = {"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}
KUBELET_INTERVAL_S = 10.0
# The Shoot's states through its life, as gardenlet writes them into the Cluster it embeds
# them in: testenv.gardener.seed_objects.cluster's fields (the wire names Gardener's types have).
SHOOT_STATES: dict[str, dict[str, Any]] = {
    "reconciled": {},
    "reconciling": {"last_operation": ("Reconcile", "Processing")},
    "reconcile-failed": {"last_operation": ("Reconcile", "Error")},
    "hibernating": {"hibernation": True, "last_operation": ("Reconcile", "Processing")},
    "hibernated": {"hibernation": True, "hibernated": True},
    "waking-up": {"hibernation": False, "hibernated": True, "last_operation": ("Reconcile", "Processing")},
    "migrating": {"last_operation": ("Migrate", "Processing")},
    "migrated": {"last_operation": ("Migrate", "Succeeded")},
    "restoring": {"last_operation": ("Restore", "Processing")},
    "deleting": {"deleting": True, "last_operation": ("Delete", "Processing")},
    "creating": {"last_operation": ("Create", "Processing")},
    "worker-less": {"workers": 0},
}
LIFECYCLES = {state: Lifecycle.of(cluster(NS, **fields)) for state, fields in SHOOT_STATES.items()}
# What a restarted replica can be rolled out with (a rollout changes the settings).
CONFIGS: dict[str, dict[str, Any]] = {
    "same": {},
    "without-ca": {"dependents": "without-ca"},
    "fraction": {"failure_fraction": 0.8, "recovery_fraction": 0.4},
    "shorter-lease": {"lease_duration_s": "shorter"},
}


def deployment_path(name: str) -> str:
    return f"/apis/apps/v1/namespaces/{NS}/deployments/{name}"


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(WALL0 + seconds, UTC)


def with_settings(settings: Settings, **changes: Any) -> Settings:
    groups: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        group = next(
            g.name for g in fields(settings) if key in {f.name for f in fields(getattr(settings, g.name))}
        )
        groups.setdefault(group, {})[key] = value
    return replace(settings, **{g: replace(getattr(settings, g), **kw) for g, kw in groups.items()})


@dataclass
class Node:
    name: str
    created: float
    skew_s: float  # the node's clock against ours: agent and kubelet share it
    kubelet_phase_s: float
    path: bool = True  # the node reaches KAPI through its external name
    agent: str = "ok"  # "ok", "403" (answered, refused), "killed"
    kubelet: bool = True
    agent_due: float = 0.0
    kubelet_due: float = 0.0
    # Since when the kubelet has been able to renew without a break (inf: it cannot now).
    kubelet_ok_since: float = 0.0
    # A loaded kubelet: each renewal, stamped when it is due, lands this much later (and the
    # next is due an interval after it lands, as the kubelet's loop waits from its return).
    kubelet_late_s: float = 0.0
    # Its renewals that fail (each retried at the next interval, as the kubelet retries).
    kubelet_fails: int = 0
    kubelet_landing: tuple[float, float] | None = None  # (lands at, stamped at)
    # Rolled: its agent stopped (released its lease) and its successor starts renewing then.
    successor_at: float = -math.inf
    # Since when its agent has worked on a working path without a break, rolled or not.
    agent_ok_since: float = 0.0
    # During a move, the renewal of the old layout's lease that follows ours (its stamp): it
    # lands a tick later, as the aggregator sees it land after ours.
    legacy_stamp: float | None = None


@dataclass
class Sent:
    """A write of the aggregator's to the seed, as it was sent."""

    at: float
    replica: int
    method: str
    path: str
    body: Any


class Link:
    """One replica's connection to an API server: cut off, holding writes, or failing the next
    writes with chosen faults; every write it sends is recorded."""

    def __init__(self, world: World, kube: FakeKube, replica: int, seed: bool) -> None:
        self.world, self.kube, self.replica, self.seed = world, kube, replica, seed
        self.cut = False
        self.hold = False
        self.faults: list[str] = []
        # Our own event loop runs this late (seconds) while requests wait: probes time out.
        self.overloaded = 0.0
        self.lag = LoopLag(clock=world.clock)

    async def request(
        self, method: str, path: str, *, body: Any = None, params: Any = None, **kw: Any
    ) -> Any:
        if self.cut:
            raise TransportError("connect", f"{method} {path}: connection refused")
        if self.world.witness_refused and not self.seed and f"/namespaces/{NODE_LEASE_NAMESPACE}/" in path:
            raise api_error(403, '{"reason":"Forbidden","message":"kubelet leases: not allowed"}')
        if method == "GET" or not self.seed:
            return await self.kube.request(method, path, body=body, params=params, **kw)
        self.world.sent.append(Sent(self.world.clock(), self.replica, method, path, copy.deepcopy(body)))
        self.world.on_write(self.world.sent[-1])
        if path.endswith("/events"):
            return body  # told, not kept: the fake's LISTs would slow down with every Event
        fault = self.faults.pop(0) if self.faults else ("held" if self.hold else "")
        if fault == "409":
            raise Conflict(409, "Conflict", f"{path}: the object has been modified")
        if fault in ("429", "500"):
            raise api_error(int(fault), f'{{"reason":"Injected","message":"{fault}"}}')
        if fault == "held":
            self.world.pending.append((method, path, copy.deepcopy(body)))
            raise TransportError("timeout", f"{method} {path}: no answer", sent=True)
        return await self.kube.request(method, path, body=body, params=params, **kw)

    async def get(self, path: str, **params: str) -> Any:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body=body)

    async def merge_patch(self, path: str, body: Any) -> Any:
        return await self.request("PATCH", path, body=body)

    async def delete(self, path: str, body: Any = None) -> Any:
        return await self.request("DELETE", path, body=body)

    async def probe(self, *, timeout_s: float, path: str = "/readyz") -> None:
        if self.cut:
            raise TransportError("connect", "probe: connection refused")
        if self.overloaded:
            self.lag.record(self.world.clock(), self.overloaded)
            raise TransportError("timeout", f"probe: no answer within {timeout_s:g}s")
        if self.world.kapi_up and not self.world.kapi_ready:
            raise api_error(500, '{"reason":"InternalError","message":"readyz check failed"}')
        await self.kube.probe(timeout_s=timeout_s, path=path)

    def watch(self, *args: Any, **kw: Any) -> Any:
        return self.kube.watch(*args, **kw)

    async def close(self) -> None:
        pass


class Replica:
    """One aggregator process: its election, its target (while the Cluster is served), its sweep;
    rolled out with its own settings and dependents (``CONFIGS``)."""

    def __init__(self, world: World, index: int, generation: int, config: str = "same") -> None:
        self.world, self.index, self.config = world, index, config
        self.seed = Link(world, world.seed, index, seed=True)
        self.shoot = Link(world, world.shoot, index, seed=False)
        self.settings, self.dependents = world.configured(config)
        settings = self.settings
        # Whether the targets' source named the shoot at its last answer (GardenerSource.serving):
        # a target that runs keeps running through states in which none would start.
        self.serving = False
        self.elector = LeaderElector(
            self.seed,
            LeaderSettings(True, LEADER_NS),
            identity=f"replica-{index}-{generation}",
            clock=world.clock,
        )
        self.next_election = world.clock()
        self.watch = SeedDependents(self.seed, self.dependents, settings.watching)
        self.watch_behind = False
        self.target: Target | None = None
        self.metrics = AggregatorMetrics()
        self.orphans = Orphans(
            self.seed,
            self.dependents,
            settings,
            self.metrics,
            served=lambda: {NS} if self.serving else set(),
            skipped_because=lambda ns: "" if world.removed else world.lifecycle().reason(self.serving),
            leadership=self.elector,
            clock=world.clock,
        )

    def new_target(self) -> Target:
        w = self.world
        scope = self.elector.scope(NS)
        shared = Shared(
            self.settings,
            self.seed,
            self.dependents,
            self.metrics,
            watched=self.watch,
            lag_since=self.shoot.lag.worst_since,
            clock=w.clock,
            wall=lambda: WALL0 + w.clock(),
        )
        target = Target("shoot", NS, self.shoot, shared, scope=scope)
        target.parts.provisioner.min_gap_s = 0.0
        return target

    async def step(self) -> None:
        w = self.world
        if w.clock() >= self.next_election:
            self.next_election += 2.0
            with contextlib.suppress(KubeError):
                await self.elector._try_once()
        if not self.watch_behind:
            for informer in self.watch.informers.values():
                try:
                    await informer.list_now()
                    informer.synced.set()
                except KubeError:
                    pass
        self.serving = not w.removed and w.lifecycle().serves(running=self.serving)
        if self.serving:
            await self._target_step()
        else:
            self.target = None  # the fleet stops a target its source no longer names
        if self.elector.leading():
            # The fleet sweeps beside its targets: a served namespace can hold records of
            # dependents no longer configured.
            await self.orphans.sweep()

    async def _target_step(self) -> None:
        w = self.world
        if self.target is None:
            self.target = self.new_target()
        t = self.target
        for informer in (t.parts.nodes, t.parts.leases, t.parts.legacy):
            if informer is None:
                continue
            try:
                await informer.list_now()
                informer.synced.set()
            except KubeError:
                pass
        if t.scope.leads() and t.parts.nodes.synced.is_set() and t.parts.leases.synced.is_set():
            await t.parts.provisioner.reconcile(t.parts.pacer.plan)
        verdict = await t.tick()
        if verdict.scale_down and t.scope.leads():
            w.scaled_down(self, t)  # a standby's verdict writes nothing: it resumes from records


class World:
    def __init__(self, rng: random.Random, settings: dict[str, Any], nodes: int, replicas: int = 2) -> None:
        self.rng = rng
        self.clock = Clock()
        self.shoot, self.seed = FakeKube(), FakeKube()
        self.shoot.wall = self.seed.wall = lambda: at(self.clock()).strftime("%Y-%m-%dT%H:%M:%SZ")
        base = Settings(ShootSettings(shoot_kubeconfig="-", namespace=NS, mode="gardener"))
        self.settings = with_settings(base, follow_polls=0, **settings)
        self.p = self.settings.decider
        self.nodes: dict[str, Node] = {}
        self.counter = 0
        for _ in range(nodes):
            self.add_node(old=True)
        for name, replicas_ in CONTROLLERS.items():
            self.seed.put(
                deployment_path(name),
                {
                    "spec": {"replicas": replicas_},
                    "status": {"replicas": replicas_, "readyReplicas": replicas_},
                },
            )
        self.kapi_up = True
        self.kapi_ready = True  # its /readyz: the nodes' load balancer admits them only then
        self.token_ok = True
        # The Shoot's state (SHOOT_STATES), and whether the targets' source names it at all.
        self.state = "reconciled"
        self.removed = False
        # gardenlet took the controllers (to 0) and has not given them back yet.
        self.taken = False
        self.pending: list[tuple[str, str, Any]] = []
        self.sent: list[Sent] = []
        self.violations: list[str] = []
        # What the controllers' owners want them at when nobody protects them: what they
        # started at, or what an operator (or dependency-watchdog's scale-up) set since.
        self.wanted = dict(CONTROLLERS)
        self.dwd_lowered: set[str] = set()
        # The agent DaemonSet's roll: nodes still to roll, how many at once (maxUnavailable), how
        # long a successor takes to start, and whether the agents rolled away release the old
        # layout's lease too (0.2.0's release only ours).
        self.rolling: list[str] = []
        self.roll_batch = 1
        self.roll_delay_s = 0.0
        self.release_both = True
        # A move from the first layout: every agent renews its lease there too, after ours.
        self.moving = False
        # The shoot refuses the aggregator the kubelets' leases (its RBAC not updated yet).
        self.witness_refused = False
        self.generations = [0] * replicas
        self.replicas = [Replica(self, i, 0) for i in range(replicas)]
        self.down = [False] * replicas  # a replica that is not running (crashed, not restarted)

    def configured(self, config: str) -> tuple[Settings, tuple[Any, ...]]:
        """A rollout's settings and dependents (``CONFIGS``)."""
        changes = dict(CONFIGS[config])
        dependents = tuple(DEFAULT_DEPENDENTS)
        if changes.pop("dependents", None) == "without-ca":
            dependents = tuple(d for d in dependents if d.name != CA)
        if changes.get("lease_duration_s") == "shorter":
            changes["lease_duration_s"] = max(2 * self.p.fast_interval_s, self.p.lease_duration_s / 2)
        return with_settings(self.settings, **changes), dependents

    # -- the truth
    def lifecycle(self) -> Lifecycle:
        """The Shoot's lifecycle, read from the Cluster as gardenlet writes it."""
        return LIFECYCLES[self.state]

    def served(self) -> bool:
        """The shoot runs as usual: its source names it, and a new target would start."""
        lc = self.lifecycle()
        return not self.removed and not lc.stop and not lc.no_start

    def owner(self) -> str:
        """Why gardenlet decides the controllers now (the lifecycle stops every target)."""
        return "" if self.removed else self.lifecycle().stop

    def replicas_now(self) -> dict[str, int]:
        return {n: int(self.seed.objects[deployment_path(n)]["spec"]["replicas"]) for n in CONTROLLERS}

    def marks(self, name: str) -> set[str]:
        ann = self.seed.objects[deployment_path(name)]["metadata"].get("annotations") or {}
        return {k for k in (RECORD, REPLICAS, MELTDOWN) if k in ann}

    def renewing(self, now: float) -> set[str]:
        """The nodes whose kubelet has been renewing for long enough that the second witness
        must know: a whole kubelet interval, the margin and the slack, and a tick."""
        window = (
            KUBELET_INTERVAL_S * (1 + KUBELET_JITTER)
            + self.p.witness_margin_s
            + self.p.witness_slack_s
            + 2 * self.p.tick_s
        )
        return {n for n, node in self.nodes.items() if node.kubelet_ok_since <= now - window}

    def scaled_down(self, replica: Replica, target: Target) -> None:
        """I1: a scale-down only while at least the failure fraction of the candidates the verdict
        judged are not renewing their kubelets."""
        now = self.clock()
        p = target.params
        # The nodes eligible before any roll: a release takes no node out of the denominator.
        unreleased = {
            n: replace(lease, view=replace(lease.view, released=False))
            for n, lease in target.parts.observed.leases.items()
        }
        counted = candidates(
            target.parts.observed.nodes,
            unreleased,
            now,
            p,
            target.parts.pacer.last().fast,
            machines=target.parts.evidence.machines.phases(),
        )
        # Without the second witness (its leases refused) the agents' verdict stands: judged
        # against the agents' truth, a roll (or a release) counting as no failure.
        witnessed = target.parts.evidence.kubelets.readings() is not None
        alive = (self.renewing(now) if witnessed else self.reaching(now)) & set(counted)
        if counted and len(alive) > (1 - p.failure_fraction) * len(counted) + 1e-9:
            what = "kubelets renewing" if witnessed else "agents reaching KAPI (no second witness)"
            self.violations.append(
                f"I1 at {now:.1f}: replica {replica.index} scaled down with {len(alive)} of "
                f"{len(counted)} candidates' {what} ({sorted(alive)}): {target.status.reason}"
            )

    def on_write(self, sent: Sent) -> None:
        """I4 (dry-run writes nothing but its election Leases) and I5 (nothing raised on a shoot
        whose owner wants it at 0), as each write is sent."""
        election = sent.path.startswith(f"/apis/coordination.k8s.io/v1/namespaces/{LEADER_NS}/leases")
        if self.settings.scaling.dry_run and not election:
            self.violations.append(f"I4 at {sent.at:.1f}: dry-run wrote {sent.method} {sent.path}")
        if self.owner() and _raises(sent.body):
            self.violations.append(f"I5 at {sent.at:.1f}: raised {sent.path} while {self.state}: {sent.body}")

    # -- nodes
    def add_node(self, *, old: bool = False) -> str:
        name = f"node-{self.counter:03d}"
        self.counter += 1
        now = self.clock()
        node = Node(
            name,
            created=now - (3600 if old else 0),
            skew_s=self.rng.choice([0.0, 3.7, -120.0, 86400.0]),
            kubelet_phase_s=self.rng.uniform(0, KUBELET_INTERVAL_S),
        )
        node.agent_due = now + self.rng.uniform(0, self.p.fast_interval_s)
        node.kubelet_due = now + node.kubelet_phase_s
        node.kubelet_ok_since = node.agent_ok_since = now - 3600 if old else now
        self.nodes[name] = node
        self.shoot.put(
            f"/api/v1/nodes/{name}",
            {"metadata": {"uid": f"uid-{name}", "creationTimestamp": _iso(at(node.created))}},
        )
        if old:
            self.shoot.put(
                node_lease_path(DEFAULT_LEASE_NAMESPACE, name),
                {
                    "metadata": {
                        **lease_metadata(name),
                        "annotations": {RENEW_INTERVAL: f"{self.p.fast_interval_s:g}s"},
                        "ownerReferences": [{"kind": "Node", "name": name, "uid": f"uid-{name}"}],
                    },
                    "spec": {
                        "holderIdentity": name,
                        "leaseDurationSeconds": round(self.p.lease_duration_s),
                        "renewTime": format_micro_time(at(now - 60)),
                    },
                },
            )
            last = node.kubelet_due - KUBELET_INTERVAL_S
            spec = {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": self.node_time(node, last),
            }
            self.shoot.put(lease_path(NODE_LEASE_NAMESPACE, name), {"spec": spec})
        return name

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.shoot.objects.pop(f"/api/v1/nodes/{name}", None)

    def node_time(self, node: Node, t: float) -> str:
        return format_micro_time(at(t + node.skew_s))

    def can_reach(self, node: Node) -> bool:
        return node.path and self.kapi_up and self.kapi_ready and node.name in self.nodes

    def agent_leases(self, name: str) -> list[dict[str, Any]]:
        """The leases a node's agent writes: ours, and the first layout's during a move."""
        paths = [node_lease_path(DEFAULT_LEASE_NAMESPACE, name)]
        if self.moving:
            paths.append(lease_path(LEGACY_LEASE_NAMESPACE, name))
        return [lease for path in paths if (lease := self.shoot.objects.get(path)) is not None]

    def _renew(self, node: Node, lease: dict[str, Any], stamp: float) -> None:
        lease["spec"]["renewTime"] = self.node_time(node, stamp)
        lease["spec"]["holderIdentity"] = node.name
        (lease["metadata"].get("annotations") or {}).pop(RELEASED, None)
        lease["metadata"]["resourceVersion"] = self.shoot._next_rv()
        managed(lease, "dwd-lease-agent", _iso(at(stamp)), RENEW_FIELDS)

    def _renew_legacy(self, node: Node) -> None:
        """The old layout's lease, renewed after ours (the tick before)."""
        if node.legacy_stamp is not None:
            for lease in self.agent_leases(node.name)[1:]:
                self._renew(node, lease, node.legacy_stamp)
            node.legacy_stamp = None

    def reaching(self, now: float) -> set[str]:
        """The nodes whose agent has worked on a working path (or rolled) for a lease duration
        and more: what the agents alone, with no second witness, must not call cut off."""
        window = self.p.lease_duration_s + 2 * self.p.tick_s
        return {n for n, node in self.nodes.items() if node.agent_ok_since <= now - window}

    def _renew_agents(self, now: float) -> None:
        for node in self.nodes.values():
            if not (node.agent == "ok" and self.can_reach(node)):
                node.agent_ok_since = math.inf
            elif node.agent_ok_since == math.inf:
                node.agent_ok_since = now
            self._renew_legacy(node)
            while node.agent_due <= now:
                due = node.agent_due
                if due < node.successor_at:  # rolled: nothing renews until the successor runs
                    node.agent_due = node.successor_at
                    continue
                interval = self.p.fast_interval_s
                own = self.agent_leases(node.name)[:1] if node.agent == "ok" and self.can_reach(node) else []
                for lease in own:
                    self._renew(node, lease, due)
                    text = (lease["metadata"].get("annotations") or {}).get(RENEW_INTERVAL, "")
                    interval = _seconds(text) or interval
                    node.legacy_stamp = due if self.moving else None
                node.agent_due = due + interval

    # -- the agents' DaemonSet
    def roll(self, names: list[str], batch: int, delay_s: float, *, release_both: bool) -> None:
        """The DaemonSet rolls ``names``, ``batch`` at a time: each agent stops (marking its
        lease released, where it can reach KAPI) and its successor starts ``delay_s`` later; the
        next batch starts once the last one's successors run."""
        self.rolling = [n for n in names if n in self.nodes]
        self.roll_batch, self.roll_delay_s, self.release_both = batch, delay_s, release_both

    def _roll_on(self, now: float) -> None:
        self.rolling = [n for n in self.rolling if n in self.nodes]
        if not self.rolling or any(node.successor_at > now for node in self.nodes.values()):
            return
        batch, self.rolling = self.rolling[: self.roll_batch], self.rolling[self.roll_batch :]
        for name in batch:
            node = self.nodes[name]
            if node.agent == "ok" and self.can_reach(node):
                self._renew_legacy(node)  # the renewal under way ends before the agent stops
                leases = self.agent_leases(name)
                for lease in leases if self.release_both else leases[:1]:
                    lease["metadata"].setdefault("annotations", {})[RELEASED] = "true"
                    lease["metadata"]["resourceVersion"] = self.shoot._next_rv()
            node.successor_at = now + self.roll_delay_s

    def move(self, on: bool) -> None:
        """A move from the first layout begins (each node's lease there, as the old aggregator
        kept it, renewed by the agents after ours) or ends (the old namespace deleted)."""
        self.moving = on
        for name in self.nodes:
            path = lease_path(LEGACY_LEASE_NAMESPACE, name)
            own = self.shoot.objects.get(node_lease_path(DEFAULT_LEASE_NAMESPACE, name))
            if not on:
                self.shoot.objects.pop(path, None)
            elif own is not None and path not in self.shoot.objects:
                old = copy.deepcopy(own)
                old["metadata"] = {k: v for k, v in old["metadata"].items() if k not in ("labels", "name")}
                old["metadata"]["name"] = name
                self.shoot.put(path, old)

    def _renew_kubelets(self, now: float) -> None:
        for node in self.nodes.values():
            ok = node.kubelet and self.can_reach(node)
            if not ok:
                node.kubelet_ok_since = math.inf
            elif node.kubelet_ok_since == math.inf:
                node.kubelet_ok_since = now
            while (at := self._kubelet_next(node)) <= now:
                if node.kubelet_landing is not None:
                    stamped = node.kubelet_landing[1]
                    node.kubelet_landing = None
                    if ok:
                        self._kubelet_write(node, stamped)
                elif ok and node.kubelet_fails:
                    # The truth: it could not renew this time (I1 counts it so, a cycle long).
                    node.kubelet_fails -= 1
                    node.kubelet_ok_since = now
                elif ok and node.kubelet_late_s:
                    node.kubelet_landing = (at + node.kubelet_late_s, at)
                    continue
                elif ok:
                    self._kubelet_write(node, at)
                node.kubelet_due = at + KUBELET_INTERVAL_S * (1 + self.rng.uniform(0, KUBELET_JITTER))

    @staticmethod
    def _kubelet_next(node: Node) -> float:
        return node.kubelet_due if node.kubelet_landing is None else node.kubelet_landing[0]

    def _kubelet_write(self, node: Node, stamped: float) -> None:
        path = lease_path(NODE_LEASE_NAMESPACE, node.name)
        spec = {
            "holderIdentity": node.name,
            "leaseDurationSeconds": 40,
            "renewTime": self.node_time(node, stamped),
        }
        if path in self.shoot.objects:
            self.shoot.objects[path]["spec"] = spec
            self.shoot.objects[path]["metadata"]["resourceVersion"] = self.shoot._next_rv()
        else:
            self.shoot.put(path, {"spec": spec})

    # -- time
    async def step(self) -> None:
        self.clock.now += self.p.tick_s
        now = self.clock()
        self._roll_on(now)
        self._renew_agents(now)
        self._renew_kubelets(now)
        self.shoot.down = not self.kapi_up
        for i, replica in enumerate(self.replicas):
            replica.shoot.cut = not self.token_ok
            if not self.down[i]:
                await replica.step()

    async def run(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / self.p.tick_s))):
            await self.step()

    # -- the seed's other writers
    def write_seed(
        self,
        name: str,
        *,
        replicas: int | None = None,
        annotations: dict[str, str | None] | None = None,
        labels: dict[str, str | None] | None = None,
    ) -> None:
        obj = self.seed.objects[deployment_path(name)]
        meta = obj["metadata"]
        for key, value in (annotations or {}).items():
            have = meta.setdefault("annotations", {})
            if value is None:
                have.pop(key, None)
            else:
                have[key] = value
        for key, value in (labels or {}).items():
            have = meta.setdefault("labels", {})
            if value is None:
                have.pop(key, None)
            else:
                have[key] = value
        if replicas is not None:
            obj["spec"]["replicas"] = replicas
            obj["status"] = {"replicas": replicas, "readyReplicas": replicas}
        meta["resourceVersion"] = self.seed._next_rv()

    def land(self, how_many: int | None = None) -> None:
        """The held writes reach the seed now (the first ``how_many``), each checked against
        the object as it is now."""
        n = len(self.pending) if how_many is None else how_many
        landing, self.pending = self.pending[:n], self.pending[n:]
        for method, path, body in landing:
            try:
                self.seed._write(method, path, body)
            except KubeError:
                continue
            if self.owner() and _raises(body):
                self.violations.append(
                    f"I5 at {self.clock():.1f}: a held write raised {path} while {self.state}"
                )

    def restart(self, index: int, *, clean: bool, config: str | None = None) -> Callable[[], Any]:
        """A replica stops (cleanly: it steps down first) and a new process starts in its place,
        with the settings it had or those of a rollout (``config``)."""
        old = self.replicas[index]

        async def stop() -> None:
            if clean and not self.down[index]:
                await old.elector.release()
            self.generations[index] += 1
            self.replicas[index] = Replica(self, index, self.generations[index], config or old.config)
            self.replicas[index].seed.faults = list(old.seed.faults)
            self.down[index] = False

        return stop


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _raises(body: Any) -> bool:
    spec = (body or {}).get("spec") if isinstance(body, dict) else None
    return isinstance(spec, dict) and isinstance(spec.get("replicas"), int) and spec["replicas"] > 0


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(text: str) -> float | None:
    try:
        from core.durations import parse_duration

        return parse_duration(text)
    except ValueError:
        return None
