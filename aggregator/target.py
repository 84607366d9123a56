"""One shoot: observe its leases and nodes, decide on each tick, act through the interlocks.

One observation travels one way: an informer parses it into a view and hands it
to ``Observed`` (aggregator/watcher.py); each ``tick`` keeps the view's
freshness, asks ``decide`` for a verdict, lets the interlocks refuse a
scale-down, and hands the phase's desired state to the ``Scaler``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from aggregator import budget
from aggregator.budget import Pacing
from aggregator.decider import (
    Desired,
    Memory,
    Phase,
    Verdict,
    blocked,
    decide,
    skipped,
    stale_fraction,
    take_over,
)
from aggregator.dependents import Dependent
from aggregator.kube import METADATA_LIST, METADATA_ONLY, KubeClient
from aggregator.machines import Machines
from aggregator.metrics import AggregatorMetrics
from aggregator.objects import NodeView
from aggregator.provisioner import Provisioner
from aggregator.scaler import Scaler
from aggregator.seeddependents import SeedDependents
from aggregator.settings import Decider, Settings
from aggregator.watcher import Informer, Observed
from aggregator.witness import KubeletLeases
from core import logs
from core.errors import KubeError
from core.lease import LeaseView, leases_path

log = logs.get("target")

NODE_PAGE = 500


class Interlock(StrEnum):
    """The checks a scale-down must pass; the value is the metrics' reason label."""

    KAPI_PROBE = "kapi_probe_failed"
    WATCH_STALE = "watch_stale"
    LIST_FAILED = "list_failed"
    LIST_DISAGREES = "list_disagrees"
    # The stale nodes' kubelets renewed after their agents went quiet: the agents fail.
    PATH_ALIVE = "kubelets_renewing"


@dataclass(frozen=True)
class Refusal:
    """An interlock that refused a scale-down, and what it saw."""

    interlock: Interlock
    detail: str

    def __str__(self) -> str:
        return f"{self.interlock}: {self.detail}"


@dataclass
class TargetStatus:
    phase: Phase = Phase.STARTING
    since_wall: float = field(default_factory=time.time)
    candidates: int = 0
    stale: int = 0
    # What the verdict judged: stale / candidates, or the stratified estimate of a sample.
    fraction: float = 0.0
    reason: str = "starting"
    # The reason the current phase was entered: what the actuator's Events say.
    phase_reason: str = "starting"
    blocked: Refusal | None = None
    # Why the view of the shoot is not trusted now ("" when it is).
    view: str = "not listed yet"
    error: str = ""
    # Per zone of the sample: (candidates, stale), so a whole-zone outage shows as one.
    zones: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Candidates whose agent is silent while their kubelet renews: not counted stale.
    path_alive: frozenset[str] = frozenset()
    # How long the last tick took, its I/O included.
    tick_s: float = 0.0
    history: collections.deque[tuple[float, float]] = field(
        default_factory=lambda: collections.deque(maxlen=600)
    )


def _with_pools(p: Decider, pools: Mapping[str, tuple[str, ...]] | None) -> Decider:
    """The shoot's own per-pool conditions (its Cluster's) over the setting's; off stays off."""
    if not pools or p.node_conditions is None:
        return p
    return replace(p, node_conditions=p.node_conditions.with_pools(pools))


class Target:
    def __init__(
        self,
        name: str,
        namespace: str,
        shoot: KubeClient,
        seed: KubeClient,
        *,
        settings: Settings,
        dependents: Sequence[Dependent],
        is_leader: Callable[[], bool] = lambda: True,
        term_end: Callable[[], float] = lambda: math.inf,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        node_conditions: Mapping[str, tuple[str, ...]] | None = None,
        metrics: AggregatorMetrics | None = None,
        watched: SeedDependents | None = None,
        events: KubeClient | None = None,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.shoot = shoot
        self.settings = settings
        self.params = _with_pools(settings.decider, node_conditions)
        self.is_leader = is_leader
        self.clock = clock
        # The sample rotates on the wall clock: a restarted or new leader draws the same one.
        self.wall = wall
        self.log = log.bind(target=name)
        self.metrics = metrics or AggregatorMetrics()
        self.observed = Observed(clock=clock)
        self.kubelets = KubeletLeases(shoot, clock=clock)
        self.machines = Machines(
            seed,
            namespace,
            keep_s=self.params.machines_keep_s,
            timeout_s=self.params.machines_timeout_s,
            clock=clock,
        )
        self.nodes, self.leases = self._informers(full_nodes=self.params.node_conditions is not None)
        self.provisioner = Provisioner(
            shoot,
            self.observed,
            settings.provisioning,
            lease_duration_s=self.params.lease_duration_s,
            pacing=self.pacing,
            label=name,
            clock=clock,
            deadline=term_end,
        )
        self.scaler = Scaler(
            seed,
            namespace,
            dependents,
            settings=settings.scaling,
            label=name,
            clock=clock,
            deadline=term_end,
            metrics=self.metrics,
            watched=None if watched is None else functools.partial(watched.get, namespace=namespace),
            events=events,
        )
        self.memory = Memory(Phase.STARTING, clock())
        self.status = TargetStatus()
        # Since when the view of the shoot has been fresh without a gap (None: not now).
        self.view_since: float | None = None
        # Since when agents have been silent while their kubelets renew, and whether it was told.
        self._silent_since: float | None = None
        self._silent_told = False
        self._tick_done: float | None = None
        self._was_leader = False
        self._pacing: Pacing | None = None
        self._pacing_for: frozenset[tuple[str, str]] = frozenset()
        self._planned_at = -math.inf
        self.metrics.set_phase(name, Phase.STARTING)
        self.metrics.synced.set(0, target=name)

    def _informers(self, *, full_nodes: bool) -> tuple[Informer[NodeView], Informer[LeaseView]]:
        common: dict[str, Any] = {"settings": self.settings.watching, "clock": self.clock, "label": self.name}
        nodes = Informer(
            self.shoot,
            "/api/v1/nodes",
            name="nodes",
            parse=NodeView.from_object,
            on_list=self.observed.nodes_listed,
            on_event=self.observed.node_event,
            # Node objects are large; their metadata is all a candidate needs
            # unless the conditions are read (unhealthy, in-place update).
            accept=None if full_nodes else METADATA_ONLY,
            list_accept=None if full_nodes else METADATA_LIST,
            # In full, one LIST of 5000 nodes is 56 MiB that parse into 220 MiB more
            # (python -m bench.node_objects); client-go's reflector pages by 500 too.
            page_size=NODE_PAGE if full_nodes else None,
            **common,
        )
        leases = Informer(
            self.shoot,
            leases_path(self.settings.provisioning.lease_namespace),
            name="leases",
            parse=LeaseView.from_object,
            on_list=self.observed.leases_listed,
            on_event=self.observed.lease_event,
            **common,
        )
        for informer in (nodes, leases):
            informer.on_restart = functools.partial(self._watch_restarted, informer.name)
        return nodes, leases

    def _watch_restarted(self, resource: str, reason: str) -> None:
        self.metrics.watch_restarts.inc(target=self.name, resource=resource, reason=reason)

    def pacing(self) -> Pacing:
        """Who renews fast and who slowly, to keep heartbeats within DWD_WRITE_BUDGET; re-planned
        when the nodes change and every REPLAN_S, as the sample rotates."""
        zones = {name: node.view.zone for name, node in self.observed.nodes.items()}
        key = frozenset(zones.items())
        now = self.clock()
        if self._pacing is None or self._pacing_for != key or now - self._planned_at >= budget.REPLAN_S:
            write_budget = self.settings.provisioning.write_budget
            fast_s = self.params.fast_interval_s
            wanted = budget.plan(zones, fast_s, write_budget, zones, now_s=self.wall())
            self._pacing = budget.hand_over(wanted, self._asked_fast(), self._renewing_fast)
            self._pacing_for, self._planned_at = key, now
            self._report_pacing(self._pacing, wanted.writes_per_s(len(zones)), write_budget)
        return self._pacing

    def _asked_fast(self) -> frozenset[str]:
        """The nodes whose lease asks for the fast interval now: the sample as it stands."""
        fast_s = self.params.fast_interval_s
        return frozenset(
            name
            for name, lease in self.observed.leases.items()
            if lease.view.interval_s is not None and lease.view.interval_s <= fast_s
        )

    def _renewing_fast(self, name: str) -> bool:
        lease = self.observed.leases.get(name)
        fast_s = self.params.fast_interval_s
        return (
            lease is not None
            and lease.view.interval_s is not None
            and lease.view.interval_s <= fast_s
            and lease.seen_renewed_mono > lease.paced_since_mono
        )

    def _report_pacing(self, pacing: Pacing, planned: float, write_budget: float) -> None:
        self.metrics.fast_nodes.set(len(pacing.fast), target=self.name)
        self.metrics.heartbeat_writes.set(pacing.writes_per_s(len(pacing.zones)), target=self.name)
        # Members kept while they hand over add a few writes for a moment; a plan over the
        # budget (the sample held at its minimum) adds them for good, and that is worth saying.
        if planned > write_budget * 1.01:
            self.log.warning(
                "write_budget_exceeded",
                planned=round(planned, 1),
                budget=write_budget,
                why=f"fewer than {budget.MIN_PER_ZONE} sampled nodes a zone would make the verdict a guess",
            )

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.nodes.run(), name=f"{self.name}/nodes")
                tg.create_task(self.leases.run(), name=f"{self.name}/leases")
                tg.create_task(self._provision_loop(), name=f"{self.name}/provision")
                tg.create_task(self._decide_loop(), name=f"{self.name}/decide")
        finally:
            await self.scaler.close()

    async def _provision_loop(self) -> None:
        await self.nodes.synced.wait()
        await self.leases.synced.wait()
        while True:
            if self.is_leader():
                await self.provisioner.reconcile()
            self.observed.changed.clear()
            # Re-check on every change, and now and then regardless (a failed write is retried).
            try:
                async with asyncio.timeout(self.settings.provisioning.recheck_s):
                    await self.observed.changed.wait()
            except TimeoutError:
                pass

    async def _decide_loop(self) -> None:
        while not (self.nodes.synced.is_set() and self.leases.synced.is_set()):
            # Not listed yet (unreachable KAPI, bad credentials): say why on the status page.
            self.status.error = self.leases.last_error or self.nodes.last_error
            await asyncio.sleep(self.params.tick_s)
        self.status.error = ""
        self.log.info("target_observing", wait_s=self.params.lease_duration_s)
        while True:
            await asyncio.sleep(self.params.tick_s)
            started = self.clock()
            await self.tick()
            # Every target shares the loop: a slow tick is a gap in the others' too (bench/seed.py).
            self.status.tick_s = self.clock() - started
            self.metrics.tick.set(self.status.tick_s, target=self.name)

    # -- one tick: the view, the verdict, the interlocks, the actuator

    async def tick(self) -> Verdict:
        now = self.clock()
        leader = self.is_leader()
        self._take_over_if_new_leader(now, leader)
        self.metrics.leading.set(1 if leader else 0, target=self.name)
        self._see(now)
        before = self.memory
        # The second witness and the Machines are read where the target is acted for: a
        # standby's reads, like its interlocks, would double the load of a seed-wide outage.
        # As leader it reads both before its first verdict (they are due).
        if leader and self._wants_witness() and self.kubelets.due(self.params.witness_every_s):
            await self._read_kubelets()
        p = self.params
        if leader and self.machines.due(p.machines_every_s if self._wants_witness() else p.machines_idle_s):
            await self._read_machines()
        verdict = await self._judge(now)
        if verdict.scale_down and leader:
            # Only the replica that acts checks: a standby's probes and LISTs would double the
            # shoots' and the seed's load in a seed-wide outage, and it acts on nothing (as a
            # new leader it starts from the records and checks before any write of its own).
            refusal = await self.interlocks()
            if refusal is not None:
                verdict = blocked(verdict, before, now, str(refusal))
                self._block(refusal)
        self._record(verdict)
        if leader:
            self._announce(verdict)
            self._report_silent_agents(now, verdict.path_alive)
        self._set_memory(verdict.memory, verdict.reason)
        if leader:
            await self._act(verdict)
        self._tick_done = self.clock()
        return verdict

    def _wants_witness(self) -> bool:
        """The kubelets are asked only while it matters: a candidate is stale (or vouched for by
        its kubelet), or the shoot is anything but healthy."""
        s = self.status
        return s.stale > 0 or bool(s.path_alive) or self.memory.phase not in (Phase.HEALTHY, Phase.STARTING)

    async def _read_kubelets(self) -> None:
        try:
            await self.kubelets.read()
        except KubeError as e:
            # No second witness is no reason to refuse protection: the agents' verdict stands.
            if str(e) != self.kubelets.error:
                self.log.warning("kubelet_leases_unreadable", error=str(e))
            self.kubelets.error = str(e)

    async def _read_machines(self) -> None:
        m = self.machines
        before = (m.error, m.absent)
        await m.read()
        # A repeating failure is told when it starts and when it ends.
        if m.error != before[0]:
            if m.error:
                self.log.warning("machines_unreadable", error=m.error)
            else:
                self.log.info("machines_readable")
        if m.absent and not before[1]:
            self.log.info("machines_absent", rule=m.rule())

    def _take_over_if_new_leader(self, now: float, leader: bool) -> None:
        if leader and not self._was_leader and self.memory.phase is not Phase.STARTING:
            # A standby judged without acting; as the new leader it resumes from the
            # annotations, like a restart, but its observations are already warm.
            self.log.info("target_leading", phase=str(self.memory.phase))
            self.memory = take_over(now)
            self.scaler.forget()  # another leader may have written since we last looked
        self._was_leader = leader

    def _see(self, now: float) -> None:
        """Keep ``view_since``: since when the view of the shoot has been fresh without a gap."""
        if not (self.nodes.synced.is_set() and self.leases.synced.is_set()):
            self._gap("not listed yet")
        elif not self._watches_fresh():
            self._gap("no data from the watches")
        elif self._tick_done is not None and now - self._tick_done > self.params.tick_s + self.params.stall_s:
            # Our own process did not run (SIGSTOP, a long GC, CPU starvation): whatever
            # the watches delivered meanwhile is still queued, the leases only look old.
            # Measured from the end of the last tick: a tick slowed by its own requests is
            # no stall, the watches ran meanwhile. The watches are fine, so the new view
            # starts now.
            self._gap(f"the aggregator itself stalled for {now - self._tick_done:.1f}s")
            self.view_since = now
        elif self.view_since is None:
            self.view_since = now
            self.log.info("view_fresh", judging_in_s=self.params.lease_duration_s)
        if self.view_since is not None and now - self.view_since >= self.params.lease_duration_s:
            self.status.view = ""  # the last gap is a lease duration behind us: judging again
        self.metrics.synced.set(1 if self.view_since is not None else 0, target=self.name)

    def _watches_fresh(self) -> bool:
        fresh_s = self.settings.watching.fresh_s
        return self.leases.fresh(fresh_s) and self.nodes.fresh(fresh_s)

    def _gap(self, why: str) -> None:
        if self.view_since is not None:
            self.log.warning("view_gap", why=why)
        self.view_since = None
        self.status.view = why

    async def _judge(self, now: float) -> Verdict:
        """The verdict on what is observed now (while starting, with the seed's record)."""
        self.status.error = self.leases.last_error or self.nodes.last_error
        records = None
        if self.memory.phase is Phase.STARTING:
            try:
                records = await self.scaler.records()
            except KubeError as e:
                self.status.error = f"reading the scale-down record: {e}"
        return decide(
            self.observed.nodes,
            self.observed.leases,
            now,
            self.params,
            self.memory,
            view_since=self.view_since,
            records=records,
            sample=self.pacing().fast,
            kubelets=self.kubelets.leases,
            machines=self.machines.phases(),
        )

    async def interlocks(self) -> Refusal | None:
        """Why a scale-down must not happen now; None when every check passes. A failed probe
        or LIST is a gap in the view: nothing is judged again for a lease duration."""
        # Judged before the requests: a failed confirming LIST leaves the watches looking stale.
        fresh = self._watches_fresh()
        # The probe, the confirming LIST, the second witness and the Machines are sent together:
        # one after the other, each added its own round trip to a real scale-down (a kubelet LIST
        # is 225-284 ms at 5000 nodes, docs/scale.md; the interlocks took 1.4 s in a seed-wide
        # outage of 250 targets, bench/seed.py). Their failures are their own: a kubelet read
        # that fails leaves no witness, a Machine read keeps the last one for a while.
        results = await asyncio.gather(
            self.shoot.probe(timeout_s=self.settings.watching.probe_timeout_s),
            self.leases.list_now(),
            self._read_kubelets(),
            self._read_machines(),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, KubeError):
                raise r  # a bug, not an answer
        if isinstance(probed := results[0], KubeError):
            self.metrics.probe_failures.inc(target=self.name)
            self._gap("the shoot KAPI did not answer the probe")
            return Refusal(Interlock.KAPI_PROBE, str(probed))
        if not fresh:
            self._gap("no data from the watches")
            return Refusal(Interlock.WATCH_STALE, "no data from the watches recently, our view may be frozen")
        if isinstance(listed := results[1], KubeError):
            self._gap("the confirming LIST failed")
            return Refusal(Interlock.LIST_FAILED, str(listed))
        confirm = decide(
            self.observed.nodes,
            self.observed.leases,
            self.clock(),
            self.params,
            self.memory,
            view_since=self.view_since,
            sample=self.pacing().fast,
            kubelets=self.kubelets.leases,
            machines=self.machines.phases(),
        )
        if not confirm.scale_down and confirm.path_alive:
            return Refusal(
                Interlock.PATH_ALIVE,
                f"{len(confirm.path_alive)} silent agents' kubelets renewed after them: the path works",
            )
        if not confirm.scale_down:
            return Refusal(
                Interlock.LIST_DISAGREES, f"a fresh LIST shows {confirm.stale}/{confirm.candidates} stale"
            )
        return None

    def _block(self, refusal: Refusal) -> None:
        self.metrics.blocked.inc(target=self.name, reason=refusal.interlock)
        previous = self.status.blocked
        if previous is None or previous.interlock is not refusal.interlock:
            self.log.warning("scale_down_blocked", why=str(refusal))
        self.status.blocked = refusal

    def _record(self, v: Verdict) -> None:
        self.status.candidates, self.status.stale, self.status.fraction = v.candidates, v.stale, v.fraction
        self.status.zones = dict(v.zones)
        self.status.path_alive = v.path_alive
        self.metrics.path_alive.set(len(v.path_alive), target=self.name)
        for zone, (n, stale) in self.status.zones.items():
            self.metrics.zone_fraction.set(stale_fraction(stale, n), target=self.name, zone=zone)
        self.status.history.append((self.wall(), v.fraction))
        self.metrics.candidates.set(v.candidates, target=self.name)
        self.metrics.stale.set(v.stale, target=self.name)
        self.metrics.fraction.set(v.fraction, target=self.name)
        if v.scale_down or (v.judged and v.memory.phase is Phase.HEALTHY):
            self.status.blocked = None  # the last refusal is history once a verdict moved on

    def _report_silent_agents(self, now: float, alive: frozenset[str]) -> None:
        """One Event an episode: agents fail on a path their kubelets prove working. Told once it
        has lasted a kubelet read (every kubelet has renewed since), so the count is the episode's."""
        if not alive:
            if self._silent_since is not None:
                self.log.info("agents_silent_path_alive_over")
            self._silent_since, self._silent_told = None, False
            return
        if self._silent_since is None:
            self._silent_since = now
        if self._silent_told or now - self._silent_since < self.params.witness_every_s:
            return
        self._silent_told = True
        self.log.warning("agents_silent_path_alive", nodes=len(alive), first=sorted(alive)[:5])
        # In the background: the Events' queue may be half a minute long in a seed-wide outage,
        # and this tick's interlocks must not be that old when it acts.
        self.scaler.report(
            "AgentsSilentPathAlive",
            f"{len(alive)} node(s) stopped renewing their dwd-node-lease leases while their kubelets "
            "keep renewing through the same path: the agents fail, not the path (look for 403, "
            "401 or 500 answers in the agents' logs, OOM kills, a crash loop). They are not "
            f"counted stale: {', '.join(sorted(alive)[:10])}",
        )

    def _announce(self, verdict: Verdict) -> None:
        """The decision to act, logged once: the actuator converges on it over the next ticks."""
        if verdict.desired is self.scaler.desired:
            return
        if verdict.desired is Desired.SCALED_DOWN:
            self.log.info("target_scale_down", reason=verdict.reason, dry_run=self.settings.scaling.dry_run)
        elif self.scaler.desired is Desired.SCALED_DOWN:
            self.log.info("target_scale_up", reason=verdict.reason)

    def _set_memory(self, memory: Memory, reason: str) -> None:
        if memory.phase is not self.memory.phase or self.status.phase is not memory.phase:
            self.log.info(
                "target_phase", phase=str(memory.phase), previous=str(self.memory.phase), reason=reason
            )
            self.status.phase = memory.phase
            self.status.phase_reason = reason
            self.status.since_wall = self.wall()
            self.metrics.set_phase(self.name, memory.phase)
        self.status.reason = reason
        self.memory = memory

    async def _act(self, verdict: Verdict) -> None:
        # Dry-run runs the actuator too: it reads, decides and reports every write, and makes none.
        if verdict.desired is not None:
            await self.scaler.converge(verdict.desired, self.status.phase_reason)

    def snapshot(self) -> dict[str, Any]:
        s = self.status
        pacing = self.pacing()
        return {
            "name": self.name,
            "namespace": self.namespace,
            "phase": str(s.phase),
            "since": s.since_wall,
            "candidates": s.candidates,
            "stale": s.stale,
            "fraction": round(s.fraction, 4),
            "reason": s.reason,
            "phase_reason": s.phase_reason,
            "blocked": str(s.blocked or ""),
            "view": s.view,
            "desired": str(self.scaler.desired or ""),
            "converged": self.scaler.converged,
            "dependents": self.scaler.snapshot(),
            "error": s.error,
            "dry_run": self.settings.scaling.dry_run,
            "held": self.memory.held,
            "leader": self.is_leader(),
            "fast_nodes": len(pacing.fast),
            "zones": {
                zone: {"candidates": n, "stale": stale, "fraction": round(stale_fraction(stale, n), 4)}
                for zone, (n, stale) in sorted(s.zones.items())
            },
            "heartbeat_writes_per_s": round(pacing.writes_per_s(len(self.observed.nodes)), 2),
            "lease_ages": {k: round(v, 2) for k, v in sorted(self.observed.lease_ages().items())},
            "agent_silent_path_alive": sorted(s.path_alive),
            "skipped": dict(
                sorted(
                    skipped(
                        self.observed.nodes,
                        self.observed.leases,
                        self.clock(),
                        self.params,
                        self.machines.phases(),
                    ).items()
                )
            ),
            "kubelet_leases_error": self.kubelets.error,
            "machines": {
                "rule": self.machines.rule(),
                "error": self.machines.error,
                "age_s": None if (age := self.machines.age_s()) is None else round(age, 1),
            },
            "tick_s": round(s.tick_s, 4),
            "history": [(round(t, 1), round(f, 4)) for t, f in list(s.history)[-300:]],
        }
