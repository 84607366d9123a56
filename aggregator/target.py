"""One shoot: observe its leases and nodes, decide on each tick, act through the interlocks.

One observation travels one way: an informer parses it into a view and hands it
to ``Observed`` (aggregator/observe/watcher.py); each ``tick`` keeps the ``View``'s
freshness, asks ``decide`` for a verdict, lets the ``Interlocks`` refuse a
scale-down, and hands the phase's desired state to the ``Scaler``. What it saw
goes to the ``Reporter``, the only writer of the status and the metrics.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aggregator.act.budget import Pacing
from aggregator.act.interlocks import Interlocks, Refusal
from aggregator.act.pacer import Pacer
from aggregator.act.provisioner import Provisioner
from aggregator.act.scaler import Scaler
from aggregator.decide.decider import Memory, Phase, Verdict, blocked, decide, deferred, skipped, take_over
from aggregator.decide.view import View
from aggregator.kube.client import KubeClient
from aggregator.lead.scope import Scope
from aggregator.model.dependents import Dependent
from aggregator.model.settings import Settings
from aggregator.observe.evidence import Evidence
from aggregator.observe.seeddependents import SeedDependents
from aggregator.observe.watcher import Informer, Observed, follow_legacy, legacy_informer, shoot_informers
from aggregator.ops.metrics import AggregatorMetrics
from aggregator.report import Reporter, TargetStatus, verdict_fields
from core import logs
from core.errors import KubeError
from core.lease import LeaseView

log = logs.get("target")


# Looked at this long after a pending kubelet's renewal was due: the read is sent after it.
WAKE_AFTER_S = 0.05


def _no_lag(_since: float) -> float:
    return 0.0


@dataclass(frozen=True)
class Shared:
    """What every target of one process shares: the settings, the seed's clients, the
    dependents, the metrics, the seed's watch of the dependents, the loop's lag and the clocks.
    Built once (aggregator/fleet.py); a target adds only its own shoot and leadership."""

    settings: Settings
    seed: KubeClient
    dependents: Sequence[Dependent]
    metrics: AggregatorMetrics = field(default_factory=AggregatorMetrics)
    watched: SeedDependents | None = None
    events: KubeClient | None = None  # the seed client Events go by (their own pace)
    lag_since: Callable[[float], float] = _no_lag
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


class Target:
    def __init__(
        self,
        name: str,
        namespace: str,
        shoot: KubeClient,
        shared: Shared,
        *,
        scope: Scope | None = None,
        node_conditions: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        settings, clock, wall = shared.settings, shared.clock, shared.wall
        self.name, self.namespace, self.shoot = name, namespace, shoot
        self.settings, self.params = settings, settings.decider.with_pools(node_conditions)
        # Whether this replica acts for the shoot, until when, and its writes (aggregator/lead/scope.py).
        self.scope = scope or Scope()
        self.clock, self.lag_since = clock, shared.lag_since
        self.log = log.bind(target=name)
        self.metrics = shared.metrics
        self.observed = Observed(clock=clock, wall=lambda: datetime.fromtimestamp(wall(), UTC))
        watched = shared.watched
        self.scaler = Scaler(
            shared.seed,
            namespace,
            shared.dependents,
            settings=settings.scaling,
            label=name,
            clock=clock,
            scope=self.scope,
            metrics=self.metrics,
            watched=None if watched is None else functools.partial(watched.get, namespace=namespace),
            events=shared.events,
        )
        self.report = Reporter(name, self.metrics, wall=wall, log=self.log, event=self.scaler.report)
        self._wire_shoot(shared.seed, wall)
        self.memory = Memory(Phase.STARTING, clock())
        # When the last verdict says to look again before the next tick (``next_tick_in``).
        self.wake_at: float | None = None
        self._was_leader = False

    def _wire_shoot(self, seed: KubeClient, wall: Callable[[], float]) -> None:
        p, clock = self.params, self.clock
        self.nodes, self.leases = shoot_informers(
            self.shoot,
            self.observed,
            lease_namespace=self.settings.provisioning.lease_namespace,
            full_nodes=p.node_conditions is not None,
            settings=self.settings.watching,
            clock=clock,
            label=self.name,
            on_restart=self.report.watch_restarted,
        )
        self.legacy = self._legacy_informer()
        self.view = View(p.lease_duration_s, tick_s=p.tick_s, stall_s=p.stall_s, log=self.log)
        self.evidence = Evidence.of(self.shoot, seed, self.namespace, p, clock=clock, log=self.log)
        self.interlocks = Interlocks(
            self.shoot,
            self.leases,
            self.evidence,
            self.view,
            watches_fresh=self._watches_fresh,
            probe_timeout_s=self.settings.watching.probe_timeout_s,
            lag_since=self.lag_since,
            clock=clock,
        )
        write_budget = self.settings.provisioning.write_budget
        self.pacer = Pacer(
            self.observed,
            fast_interval_s=p.fast_interval_s,
            write_budget=write_budget,
            clock=clock,
            wall=wall,
            on_plan=functools.partial(self.report.planned, write_budget=write_budget),
        )
        self.provisioner = Provisioner(
            self.shoot,
            self.observed,
            self.settings.provisioning,
            lease_duration_s=p.lease_duration_s,
            label=self.name,
            clock=clock,
            deadline=self.scope.term_end,
        )

    def _legacy_informer(self) -> Informer[LeaseView] | None:
        legacy = self.settings.provisioning.legacy_namespace
        if not legacy:
            return None
        watching, clock = self.settings.watching, self.clock
        return legacy_informer(
            self.shoot, self.observed, legacy, settings=watching, clock=clock, label=self.name
        )

    @property
    def status(self) -> TargetStatus:
        return self.report.status

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.nodes.run(), name=f"{self.name}/nodes")
                tg.create_task(self.leases.run(), name=f"{self.name}/leases")
                if self.legacy is not None:
                    tg.create_task(follow_legacy(self.legacy, self.log), name=f"{self.name}/legacy-leases")
                tg.create_task(self._provision_loop(), name=f"{self.name}/provision")
                tg.create_task(self._decide_loop(), name=f"{self.name}/decide")
        finally:
            await self.scaler.close()

    def _listed(self) -> bool:
        return self.nodes.synced.is_set() and self.leases.synced.is_set()

    async def _provision_loop(self) -> None:
        await self.nodes.synced.wait()
        await self.leases.synced.wait()
        while True:
            if self.scope.leads():
                await self.provisioner.reconcile(self.pacer.plan)
            self.observed.changed.clear()
            # Re-check on every change, and now and then regardless (a failed write is retried).
            try:
                async with asyncio.timeout(self.settings.provisioning.recheck_s):
                    await self.observed.changed.wait()
            except TimeoutError:
                pass

    async def _decide_loop(self) -> None:
        # Ticks from the start, listed or not: a start that finds records of ours must reach the
        # blind limit even when the shoot never answers (a revoked token, a broken network
        # policy), or what it holds down would stay down for good. Until listed the view is not
        # current, so nothing is judged; the reason is on the status page.
        self.log.info("target_observing", wait_s=self.params.lease_duration_s)
        while True:
            await asyncio.sleep(self.next_tick_in(self.clock()))
            started = self.clock()
            await self.tick()
            self.report.ticked(self.clock() - started)

    def next_tick_in(self, now: float) -> float:
        """A tick from now, or sooner where the last verdict says a look can change it before
        then (``Verdict.wake_at``): the quorum lost, the confirm period ended, a pending
        kubelet's renewal due. A real cut waits no tick for its verdict."""
        wake_at = self.wake_at
        if wake_at is not None and now < wake_at + WAKE_AFTER_S < now + self.params.tick_s:
            return wake_at + WAKE_AFTER_S - now
        return self.params.tick_s

    async def tick(self) -> Verdict:
        """One look at the shoot, in the order a write needs it."""
        now = self.clock()
        leader = self._lead(now)
        # 1. How far the view is trusted, and what it shows.
        now = await self._see(now)
        before = self.memory
        # 2. The reads beside the watches, where a write may follow: a standby's would double
        #    the load of a seed-wide outage. As leader it reads both before its first verdict.
        if leader:
            await self.evidence.read_due(wanted=self._troubled())
        # 3. The verdict, on the pacing planned for this tick (the interlocks confirm on it too).
        pacing = self.pacer.plan()
        verdict = await self._verdict_now(now, pacing)
        # 4. The interlocks, only on the replica that acts: as a new leader a standby starts
        #    from the records and checks before any write of its own.
        if verdict.scale_down and leader and (refusal := await self.refusal(pacing)) is not None:
            verdict = (
                deferred(verdict, before) if refusal.deferred else blocked(verdict, before, now, str(refusal))
            )
            self.report.refused(refusal)
        self.report.verdict(verdict)
        self.report.gaps(self.view)
        if leader:
            self.report.decision(verdict, self.scaler.desired, dry_run=self.settings.scaling.dry_run)
            self.report.silent_agents(now, verdict.path_alive, after_s=self.params.witness_every_s)
        self.report.phase(self.memory, verdict.memory, verdict.reason)
        self.memory = verdict.memory
        self.wake_at = verdict.wake_at
        # 5. The actuator, dry-run too: it reads, decides and reports every write, and makes none.
        if leader and verdict.desired is not None:
            await self.scaler.converge(verdict.desired, self.status.phase_reason)
        self.view.ticked(self.clock())
        return verdict

    async def _see(self, now: float) -> float:
        """Keep the view's freshness; the time it was seen (after the probe, where one is sent).
        The shoot KAPI's readiness is asked only while the view is in a gap and could start
        again: one request per gap, none while the view is trusted (aggregator/decide/view.py)."""
        listed, fresh, unready = self._listed(), self._watches_fresh(), ""
        if listed and fresh and self.view.since is None:
            try:
                await self.shoot.probe(timeout_s=self.settings.watching.probe_timeout_s)
            except KubeError as e:
                unready = f"the shoot KAPI is not ready: {e}"
            now = self.clock()
        self.view.see(now, listed=listed, watches_fresh=fresh, unready=unready)
        self.report.view(self.view)
        return now

    def _lead(self, now: float) -> bool:
        leader = self.scope.leads()
        if leader and not self._was_leader and self.memory.phase is not Phase.STARTING:
            # A standby judged without acting; as the new leader it resumes from the
            # annotations, like a restart, but its observations are already warm.
            self.log.info("target_leading", phase=str(self.memory.phase))
            self.memory = take_over(now)
            self.scaler.forget()  # another leader may have written since we last looked
        self._was_leader = leader
        self.report.leading(leader)
        return leader

    def _troubled(self) -> bool:
        """Whether the Machines matter now (read often, not rarely): a candidate is stale (or
        vouched for by its kubelet), or the shoot is anything but healthy."""
        s = self.status
        return s.stale > 0 or bool(s.path_alive) or self.memory.phase not in (Phase.HEALTHY, Phase.STARTING)

    def _watches_fresh(self) -> bool:
        fresh_s = self.settings.watching.fresh_s
        return self.leases.fresh(fresh_s) and self.nodes.fresh(fresh_s)

    async def _verdict_now(self, now: float, pacing: Pacing) -> Verdict:
        """The verdict on what is observed now (while starting, with the seed's record)."""
        self.report.error(self.leases.last_error or self.nodes.last_error)
        records = None
        if self.memory.phase is Phase.STARTING:
            try:
                records = await self.scaler.records()
            except KubeError as e:
                self.report.error(f"reading the scale-down record: {e}")
        return self._verdict(now, pacing, records)

    def _verdict(
        self, now: float, pacing: Pacing, records: bool | None = None, *, confirming: bool = False
    ) -> Verdict:
        return decide(
            self.observed.nodes,
            self.observed.leases,
            now,
            self.params,
            self.memory,
            view_since=self.view.since,
            records=records,
            sample=pacing.fast,
            kubelets=self.evidence.kubelets.readings(),
            machines=self.evidence.machines.phases(),
            confirming=confirming,
        )

    async def refusal(self, pacing: Pacing | None = None) -> Refusal | None:
        """Why a scale-down must not happen now (aggregator/act/interlocks.py); None when every
        check passes. The confirming verdict judges what the fresh LIST left in the view."""
        plan = self.pacer.plan() if pacing is None else pacing
        return await self.interlocks.refusal(lambda: self._verdict(self.clock(), plan, confirming=True))

    def snapshot(self) -> dict[str, Any]:
        """This target as the status page and ``/status`` show it."""
        return {
            "name": self.name,
            "namespace": self.namespace,
            **verdict_fields(self.status),
            "desired": str(self.scaler.desired or ""),
            "converged": self.scaler.converged,
            "dependents": self.scaler.snapshot(),
            "dry_run": self.settings.scaling.dry_run,
            "held": self.memory.held,
            "leader": self.scope.leads(),
            **self._shoot(),
            "tick_s": round(self.status.tick_s, 4),
            "history": [(round(at, 1), round(f, 4)) for at, f in list(self.status.history)[-300:]],
        }

    def _shoot(self) -> dict[str, Any]:
        """What the shoot looks like now: its leases, its pacing, the reads beside the watches."""
        pacing, observed, machines = self.pacer.last(), self.observed, self.evidence.machines
        left_out = skipped(observed.nodes, observed.leases, self.clock(), self.params, machines.phases())
        return {
            "fast_nodes": len(pacing.fast),
            "heartbeat_writes_per_s": round(pacing.writes_per_s(len(observed.nodes)), 2),
            "lease_ages": {k: round(v, 2) for k, v in sorted(observed.lease_ages().items())},
            "skipped": dict(sorted(left_out.items())),
            "kubelet_leases_error": self.evidence.kubelets.error,
            "machines": {
                "rule": machines.rule(),
                "error": machines.error,
                "age_s": None if (age := machines.age_s()) is None else round(age, 1),
            },
        }
