"""A shoot and its seed in memory, for driving the aggregator's Target tick by tick.

Agents renew at the interval their lease asks for (adopted at each renewal, as
the real agent does); the informers are fed by a LIST each tick; the clock is
manual. The seed's deployments start as CONTROLLERS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from aggregator.lead.scope import Scope
from aggregator.model.dependents import DEFAULT_DEPENDENTS, Dependent
from aggregator.model.observed import NODE_LEASE_NAMESPACE
from aggregator.model.records import MELTDOWN, REPLICAS
from aggregator.model.settings import Settings, ShootSettings
from aggregator.model.verdict import Phase
from aggregator.ops.looplag import LoopLag
from aggregator.shoot import Shared
from aggregator.target import Target
from core.durations import parse_duration
from core.errors import KubeError
from core.lease import (
    DEFAULT_LEASE_NAMESPACE,
    RENEW_INTERVAL,
    format_micro_time,
    lease_metadata,
    lease_path,
    node_lease_path,
)
from testenv.kube.controllers import CONTROLLERS, DOWN
from tests.unit.fakekube import FakeKube, managed

NS = "shoot--p--s"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
INTERVAL_FIELDS: dict[str, Any] = {"f:metadata": {"f:annotations": {f"f:{RENEW_INTERVAL}": {}}}}
RENEW_FIELDS: dict[str, Any] = {"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}


# The wall clock the target's sample rotates on: the fake clock, from a fixed epoch.
WALL0 = 1_796_000_000.0


def with_settings(settings: Settings, **changes: Any) -> Settings:
    """``settings`` with fields changed by their own names, whichever group holds them."""
    groups: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        group = next(
            g.name for g in fields(settings) if key in {f.name for f in fields(getattr(settings, g.name))}
        )
        groups.setdefault(group, {})[key] = value
    return replace(settings, **{g: replace(getattr(settings, g), **kw) for g, kw in groups.items()})


def deployment_path(name: str) -> str:
    return f"/apis/apps/v1/namespaces/{NS}/deployments/{name}"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class World:
    def __init__(
        self,
        nodes: int = 10,
        *,
        dependents: Sequence[Dependent] = DEFAULT_DEPENDENTS,
        interval: str = "2s",
        **settings: Any,
    ) -> None:
        self.clock = Clock()
        # How late the aggregator's event loop runs, as its LoopLag records it.
        self.loop_lag = LoopLag(clock=self.clock)
        self.shoot, self.seed = FakeKube(), FakeKube()
        self.shoot.wall = self.wall
        # The clock is fake: a level's follow polls would be real sleeps (tests/unit/test_scaler.py).
        settings = {"follow_polls": 0} | settings
        self.settings = with_settings(Settings(ShootSettings(shoot_kubeconfig="-", namespace=NS)), **settings)
        self.dependents = tuple(dependents)
        self.names = [f"node-{i:04d}" for i in range(nodes)]
        self.alive = set(self.names)
        self.due: dict[str, float] = {}
        self.leader = True
        self.term_end = math.inf
        for i, name in enumerate(self.names):
            node = self.shoot.put(
                f"/api/v1/nodes/{name}",
                {"metadata": {"uid": f"uid-{name}", "creationTimestamp": "2020-01-01T00:00:00Z"}},
            )
            lease = self.shoot.put(
                node_lease_path(DEFAULT_LEASE_NAMESPACE, name),
                {
                    "metadata": {
                        **lease_metadata(name),
                        "annotations": {RENEW_INTERVAL: interval},
                        "ownerReferences": [{"kind": "Node", "name": name, "uid": node["metadata"]["uid"]}],
                    },
                    "spec": {
                        "holderIdentity": name,
                        "leaseDurationSeconds": round(self.settings.decider.lease_duration_s),
                        "renewTime": format_micro_time(T0),
                    },
                },
            )
            managed(lease, "dwd-lease-aggregator", "2026-11-30T11:00:00Z", INTERVAL_FIELDS)
            managed(lease, "dwd-lease-agent", "2026-11-30T11:59:00Z", RENEW_FIELDS)
            # Spread the agents' phases over their interval, as real agents are.
            self.due[name] = self.clock() + (i % 10) * parse_duration(interval) / 10
        for name, replicas in CONTROLLERS.items():
            self.seed.put(
                deployment_path(name),
                {"spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": replicas}},
            )
        # The kubelets of ``alive`` renew kube-node-lease every 10 s, each at its own phase, on
        # its node's clock (``skew_s``, shared with the node's agent): ``alive`` is the nodes
        # whose path works. ``agents_failing``: agents that fail on a working path (403, a
        # broken webhook, OOM-killed), ``kubelets``: the kubelets that run at all.
        self.agents_failing: set[str] = set()
        self.kubelets = set(self.names)
        self.skew_s: dict[str, float] = {}
        self.kubelet_due = {name: self.clock() + (i % 10) for i, name in enumerate(self.names)}
        # Every replica's Target over this shoot and seed, stepped together; ``target`` is the first.
        self.targets: list[Target] = []
        self.target = self.new_target()
        self.trace: list[tuple[float, dict[str, int]]] = []

    def new_target(
        self,
        *,
        is_leader: Callable[[], bool] | None = None,
        term_end: Callable[[], float] | None = None,
        replace_first: bool = True,
        **settings: Any,
    ) -> Target:
        """A Target over this world (a restart replaces the first; ``replace_first=False`` adds
        another replica's), leading while ``is_leader`` says so (the world's ``leader``)."""
        if settings:
            self.settings = with_settings(self.settings, **settings)
        shared = Shared(
            self.settings,
            self.seed,
            self.dependents,
            lag_since=self.loop_lag.worst_since,
            clock=self.clock,
            wall=lambda: WALL0 + self.clock(),
        )
        scope = Scope(is_leader or (lambda: self.leader), term_end or (lambda: self.term_end))
        target = Target("shoot", NS, self.shoot, shared, scope=scope)
        target.parts.provisioner.min_gap_s = 0.0
        if replace_first:
            self.target = target
            self.targets[:1] = [target]
        else:
            self.targets.append(target)
        return target

    # -- the agents
    def renew(self) -> None:
        """Every agent of ``alive`` whose time has come renews, if it can reach KAPI."""
        if self.shoot.down:
            return
        now = self.clock()
        for name in sorted(self.alive - self.agents_failing):
            path = node_lease_path(DEFAULT_LEASE_NAMESPACE, name)
            lease = self.shoot.objects.get(path)
            if lease is None or self.due.get(name, now) > now:
                continue
            lease["spec"]["renewTime"] = self.node_time(name)
            lease["metadata"]["resourceVersion"] = self.shoot._next_rv()
            managed(lease, "dwd-lease-agent", self.wall(), RENEW_FIELDS)
            # The agent adopts the interval its PATCH response carries.
            interval = (lease["metadata"].get("annotations") or {}).get(RENEW_INTERVAL, "2s")
            self.due[name] = now + parse_duration(interval)

    def node_time(self, name: str) -> str:
        """The node's own clock as MicroTime: ours, off by the node's skew."""
        return format_micro_time(T0 + timedelta(seconds=self.clock() + self.skew_s.get(name, 0.0)))

    def renew_kubelets(self) -> None:
        """Every running kubelet of a node whose path works renews when its 10 s have come."""
        if self.shoot.down:
            return
        now = self.clock()
        for name in sorted(self.kubelets & self.alive):
            if self.kubelet_due[name] > now:
                continue
            path = lease_path(NODE_LEASE_NAMESPACE, name)
            spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": self.node_time(name)}
            if path in self.shoot.objects:
                self.shoot.objects[path]["spec"] = spec
                self.shoot.objects[path]["metadata"]["resourceVersion"] = self.shoot._next_rv()
            else:
                self.shoot.put(path, {"spec": spec})
            self.kubelet_due[name] = now + 10.0

    def wall(self) -> str:
        """The API server's wall clock, as managedFields stamp it (whole seconds)."""
        return (T0 + timedelta(seconds=self.clock())).strftime("%Y-%m-%dT%H:%M:%SZ")

    # -- one tick of everything
    async def step(self, *, provision: bool = True) -> None:
        self.clock.now += self.settings.decider.tick_s
        self.renew()
        self.renew_kubelets()
        for t in self.targets:
            for informer in (t.parts.nodes, t.parts.leases):
                try:
                    await informer.list_now()
                    informer.synced.set()
                except KubeError:
                    pass
            if provision and t.scope.leads():
                await t.parts.provisioner.reconcile(t.parts.pacer.plan)
            await t.tick()
        self.trace.append((self.clock(), self.replicas()))

    async def run(self, seconds: float, **kw: Any) -> None:
        for _ in range(round(seconds / self.settings.decider.tick_s)):
            await self.step(**kw)

    async def settle(self) -> None:
        """Past the start: a lease duration of fresh view, the record read, every lease judged."""
        await self.run(12)
        assert self.target.memory.phase is Phase.HEALTHY, self.target.status.reason
        assert self.target.status.candidates == len(self.names)

    async def outage(self, nodes: int = 7) -> None:
        """``nodes`` agents fall silent until every controller is at 0."""
        self.alive -= set(self.names[:nodes])
        await self.until(lambda: self.replicas() == DOWN, 40, "every controller scaled down")

    async def until(self, predicate: Any, seconds: float, what: str) -> float:
        """Step until ``predicate()`` holds; the seconds it took."""
        start = self.clock()
        for _ in range(round(seconds / self.settings.decider.tick_s)):
            await self.step()
            if predicate():
                return self.clock() - start
        raise AssertionError(f"not within {seconds}s: {what}; phase {self.target.memory.phase}")

    # -- what the seed shows
    def replicas(self) -> dict[str, int]:
        return {n: int(self.seed.objects[deployment_path(n)]["spec"]["replicas"]) for n in CONTROLLERS}

    def annotations(self, name: str) -> dict[str, str]:
        ann = self.seed.objects[deployment_path(name)]["metadata"].get("annotations") or {}
        return {k: v for k, v in ann.items() if k in (REPLICAS, MELTDOWN)}

    # -- the seed's other writers: dependency-watchdog, operators
    def annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        """Someone else sets (or, with None, removes) annotations on a dependent."""
        obj = self.seed.objects[deployment_path(name)]
        have = obj["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                have.pop(key, None)
            else:
                have[key] = value
        obj["metadata"]["resourceVersion"] = self.seed._next_rv()

    def scale(self, name: str, replicas: int) -> None:
        """Someone else (an operator's kubectl scale, dependency-watchdog) sets spec.replicas."""
        obj = self.seed.objects[deployment_path(name)]
        obj["spec"]["replicas"] = replicas
        obj["metadata"]["resourceVersion"] = self.seed._next_rv()
        if self.seed.controller:
            self.seed.follow(deployment_path(name))

    def dwd_scale_down(self, name: str) -> None:
        """What dependency-watchdog v1.7.0's prober writes when it scales a dependent down."""
        current = int(self.seed.objects[deployment_path(name)]["spec"]["replicas"])
        if current > 0:
            self.annotate(name, {REPLICAS: str(current), MELTDOWN: ""})
            self.scale(name, 0)

    def dwd_scale_up(self, name: str) -> None:
        """What its scale-up writes: a dependent at 0 goes to its ``replicas`` annotation (1 without
        one), whoever lowered it; only ``meltdown-protection-active`` is removed, ``replicas`` stays."""
        obj = self.seed.objects[deployment_path(name)]
        if int(obj["spec"]["replicas"]) == 0:
            self.scale(name, int((obj["metadata"].get("annotations") or {}).get(REPLICAS, "1")))
        self.annotate(name, {MELTDOWN: None})

    def ever_scaled_down(self) -> bool:
        return any(min(r.values()) == 0 for _, r in self.trace)

    def restored(self) -> bool:
        return self.replicas() == CONTROLLERS and not any(self.annotations(n) for n in CONTROLLERS)
