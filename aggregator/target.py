"""One shoot: observe its leases and nodes, decide on each tick, act through the interlocks.

One observation travels one way: an informer parses it into a view and hands it
to ``Observed`` (aggregator/observe/watcher.py); each ``tick`` keeps the ``TrustWindow``'s
freshness, asks ``decide`` for a verdict, lets the ``Interlocks`` refuse a
scale-down, and hands the phase's desired state to the ``Scaler``. What it saw
goes to the ``Reporter``, the only writer of the status and the metrics.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

from aggregator.act.budget import Pacing
from aggregator.act.interlocks import Refusal
from aggregator.act.scaler import Scaler
from aggregator.decide.decider import Look, decide
from aggregator.decide.phases import blocked, deferred, take_over
from aggregator.kube.client import KubeApi
from aggregator.lead.scope import Scope
from aggregator.model.verdict import Memory, Phase, Verdict
from aggregator.observe.watcher import follow_legacy
from aggregator.report import Reporter, TargetStatus, verdict_fields
from aggregator.shoot import Shared, wire
from core import logs
from core.errors import KubeError

log = logs.get("target")


# Looked at this long after a pending kubelet's renewal was due: the read is sent after it.
WAKE_AFTER_S = 0.05


class Target:
    def __init__(
        self,
        name: str,
        namespace: str,
        shoot: KubeApi,
        shared: Shared,
        *,
        scope: Scope,
        node_conditions: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        settings, clock = shared.settings, shared.clock
        self.name, self.namespace, self.shoot = name, namespace, shoot
        self.settings, self.params = settings, settings.decider.with_pools(node_conditions)
        # Whether this replica acts for the shoot, until when, and its writes (aggregator/lead/scope.py).
        self.scope = scope
        self.clock, self.lag_since = clock, shared.lag_since
        self.log = log.bind(target=name)
        self.metrics = shared.metrics
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
        self.report = Reporter(name, self.metrics, wall=shared.wall, log=self.log, event=self.scaler.report)
        self.report.dry_run(settings.scaling.dry_run)
        self.parts = wire(
            name,
            namespace,
            shoot,
            shared,
            params=self.params,
            scope=self.scope,
            report=self.report,
            log=self.log,
        )
        self.memory = Memory(Phase.STARTING, clock())
        # When the last verdict says to look again before the next tick (``next_tick_in``).
        self.wake_at: float | None = None
        self._was_leader = False

    @property
    def status(self) -> TargetStatus:
        return self.report.status

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.parts.nodes.run(), name=f"{self.name}/nodes")
                tg.create_task(self.parts.leases.run(), name=f"{self.name}/leases")
                if self.parts.legacy is not None:
                    tg.create_task(
                        follow_legacy(self.parts.legacy, self.log), name=f"{self.name}/legacy-leases"
                    )
                tg.create_task(self._provision_loop(), name=f"{self.name}/provision")
                tg.create_task(self._decide_loop(), name=f"{self.name}/decide")
        finally:
            await self.scaler.close()

    async def _provision_loop(self) -> None:
        await self.parts.nodes.synced.wait()
        await self.parts.leases.synced.wait()
        while True:
            if self.scope.leads():
                await self.parts.provisioner.reconcile(self.parts.pacer.plan)
            self.parts.observed.changed.clear()
            # Re-check on every change, and now and then regardless (a failed write is retried).
            try:
                async with asyncio.timeout(self.settings.provisioning.recheck_s):
                    await self.parts.observed.changed.wait()
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
            await self.parts.evidence.read_due(wanted=self._troubled())
        # 3. The verdict, on the pacing planned for this tick (the interlocks confirm on it too).
        pacing = self.parts.pacer.plan()
        verdict = await self._verdict_now(now, pacing)
        # 4. The interlocks, only on the replica that acts: as a new leader a standby starts
        #    from the records and checks before any write of its own.
        if verdict.scale_down and leader and (refusal := await self.refusal(pacing)) is not None:
            verdict = (
                deferred(verdict, before) if refusal.deferred else blocked(verdict, before, now, str(refusal))
            )
            self.report.refused(refusal)
        self.report.verdict(verdict)
        self.report.gaps(self.parts.view)
        if leader:
            self.report.decision(verdict, self.scaler.desired, dry_run=self.settings.scaling.dry_run)
            self.report.silent_agents(now, verdict.path_alive, after_s=self.params.witness_every_s)
        self.report.phase(self.memory, verdict.memory, verdict.reason)
        self.memory = verdict.memory
        self.wake_at = verdict.wake_at
        # 5. The actuator, dry-run too: it reads, decides and reports every write, and makes none.
        if leader and verdict.desired is not None:
            await self.scaler.converge(verdict.desired, self.status.phase_reason)
        self.parts.view.ticked(self.clock())
        return verdict

    async def _see(self, now: float) -> float:
        """Keep the view's freshness; the time it was seen (after the probe, where one is sent).
        The shoot KAPI's readiness is asked only while the view is in a gap and could start
        again: one request per gap, none while the view is trusted (aggregator/decide/trust.py)."""
        listed, fresh, unready = self.parts.listed(), self.parts.watches_fresh(), ""
        if listed and fresh and self.parts.view.since is None:
            try:
                await self.shoot.probe(timeout_s=self.settings.watching.probe_timeout_s)
            except KubeError as e:
                unready = f"the shoot KAPI is not ready: {e}"
            now = self.clock()
        self.parts.view.see(now, listed=listed, watches_fresh=fresh, unready=unready)
        self.report.view(self.parts.view)
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
        status = self.status
        return (
            status.stale > 0
            or bool(status.path_alive)
            or self.memory.phase not in (Phase.HEALTHY, Phase.STARTING)
        )

    async def _verdict_now(self, now: float, pacing: Pacing) -> Verdict:
        """The verdict on what is observed now (while starting, with the seed's record)."""
        self.report.error(self.parts.leases.last_error or self.parts.nodes.last_error)
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
            Look(
                self.parts.observed.nodes,
                self.parts.observed.leases,
                now,
                self.params,
                self.memory,
                view_since=self.parts.view.since,
                records=records,
                sample=pacing.fast,
                kubelets=self.parts.evidence.kubelets.readings(),
                machines=self.parts.evidence.machines.phases(),
                confirming=confirming,
            )
        )

    async def refusal(self, pacing: Pacing | None = None) -> Refusal | None:
        """Why a scale-down must not happen now (aggregator/act/interlocks.py); None when every
        check passes. The confirming verdict judges what the fresh LIST left in the view."""
        plan = self.parts.pacer.plan() if pacing is None else pacing
        return await self.parts.interlocks.refusal(lambda: self._verdict(self.clock(), plan, confirming=True))

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
            **self.parts.status(self.clock(), self.params),
            "tick_s": round(self.status.tick_s, 4),
            "history": [(round(at, 1), round(f, 4)) for at, f in list(self.status.history)[-300:]],
        }
