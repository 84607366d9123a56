"""A target's status and metrics, written in one place.

The ``Reporter`` is the only writer of ``TargetStatus`` and of a target's
metric series: a tick hands it what it saw (the view, a verdict, a refusal, a
phase) and it keeps the page and the series in step. ``snapshot`` is the
status page's and ``/status``'s JSON of one target.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from structlog.typing import FilteringBoundLogger

from aggregator.act import budget
from aggregator.act.interlocks import Interlock, Refusal
from aggregator.act.pacer import Plan
from aggregator.decide.trust import TrustWindow
from aggregator.model.eligibility import PACE_REASONS
from aggregator.model.verdict import Desired, Memory, Phase, Verdict, stale_fraction
from aggregator.ops.metrics import AggregatorMetrics

# How long a target's first view may take to open before its lack is a gap.
OPENING_S = 60.0


@dataclass
class TargetStatus:
    since_wall: float
    phase: Phase = Phase.STARTING
    # The last verdict judged a quorum (False: starting, no view of the shoot, too few
    # candidates): a healthy phase then says only that nothing is held down.
    judging: bool = False
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
    # Starting to judge: the view is fresh and waits out a lease duration before it is trusted,
    # or it has not been trusted yet since the target started (for up to OPENING_S).
    view_opening: bool = False
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


class Reporter:
    def __init__(
        self,
        name: str,
        metrics: AggregatorMetrics,
        *,
        wall: Callable[[], float],
        log: FilteringBoundLogger,
        event: Callable[[str, str], None],
    ) -> None:
        self.name = name
        self.metrics = metrics
        self.wall = wall
        self.log = log
        # An Event to the shoot's namespace, sent in the background (Scaler.report).
        self.event = event
        self.status = TargetStatus(since_wall=wall())
        self._started_wall = self.status.since_wall
        self._trusted_once = False
        # Since when agents have been silent while their kubelets renew, and whether it was told.
        self._silent_since: float | None = None
        self._silent_told = False
        self._left_out: Mapping[str, str] = {}
        metrics.set_phase(name, Phase.STARTING)
        metrics.synced.set(0, target=name)

    def error(self, text: str) -> None:
        self.status.error = text

    def dry_run(self, dry: bool) -> None:
        self.metrics.target_dry_run.set(1 if dry else 0, target=self.name)

    def leading(self, leader: bool) -> None:
        self.metrics.leading.set(1 if leader else 0, target=self.name)

    def view(self, view: TrustWindow) -> None:
        """The view as the tick starts: ``dwd_target_synced`` says whether the watches have
        listed and are fresh, and is written only here."""
        self.gaps(view)
        self.metrics.synced.set(1 if view.since is not None else 0, target=self.name)

    def gaps(self, view: TrustWindow) -> None:
        """Why the view is not trusted after the interlocks (a failed probe or LIST is a gap)."""
        self.status.view = view.why
        self._trusted_once = self._trusted_once or not view.why
        # A start's first watches and lists are no gap: 250 targets starting at once took 13 s
        # to their first fresh view (bench/extensions.py), and each reported "not current".
        first = not self._trusted_once and self.wall() - self._started_wall < OPENING_S
        self.status.view_opening = bool(view.why) and (view.since is not None or first)

    def ticked(self, seconds: float) -> None:
        # Every target shares the loop: a slow tick is a gap in the others' too (bench/seed.py).
        self.status.tick_s = seconds
        self.metrics.tick.set(seconds, target=self.name)

    def watch_restarted(self, resource: str, reason: str) -> None:
        self.metrics.watch_restarts.inc(target=self.name, resource=resource, reason=reason)

    def planned(self, plan: Plan, write_budget: float) -> None:
        pacing = plan.pacing
        self.metrics.fast_nodes.set(len(pacing.fast), target=self.name)
        self.metrics.heartbeat_writes.set(pacing.writes_per_s(len(pacing.zones)), target=self.name)
        # Members kept while they hand over add a few writes for a moment; a plan over the
        # budget (the sample held at its minimum) adds them for good, and that is worth saying.
        if plan.wanted_writes_per_s > write_budget * 1.01:
            self.log.warning(
                "write_budget_exceeded",
                planned=round(plan.wanted_writes_per_s, 1),
                budget=write_budget,
                why=f"fewer than {budget.MIN_PER_ZONE} sampled nodes a zone would make the verdict a guess",
            )

    def refused(self, refusal: Refusal) -> None:
        if refusal.interlock is Interlock.KAPI_PROBE:
            self.metrics.probe_failures.inc(target=self.name)
        self.metrics.blocked.inc(target=self.name, reason=refusal.interlock)
        previous = self.status.blocked
        if previous is None or previous.interlock is not refusal.interlock:
            self.log.warning("scale_down_blocked", why=str(refusal))
        self.status.blocked = refusal

    def verdict(self, verdict: Verdict) -> None:
        status, metrics = self.status, self.metrics
        status.candidates, status.stale, status.fraction, status.judging = (
            verdict.candidates,
            verdict.stale,
            verdict.fraction,
            verdict.judged,
        )
        status.zones = dict(verdict.zones)
        status.path_alive = verdict.path_alive
        metrics.path_alive.set(len(verdict.path_alive), target=self.name)
        for zone, (n, stale) in status.zones.items():
            metrics.zone_fraction.set(stale_fraction(stale, n), target=self.name, zone=zone)
        status.history.append((self.wall(), verdict.fraction))
        metrics.candidates.set(verdict.candidates, target=self.name)
        metrics.stale.set(verdict.stale, target=self.name)
        metrics.fraction.set(verdict.fraction, target=self.name)
        if verdict.scale_down or (verdict.judged and verdict.memory.phase is Phase.HEALTHY):
            status.blocked = None  # the last refusal is history once a verdict moved on
        self._tell_left_out(verdict.left_out)

    def _tell_left_out(self, now: Mapping[str, str]) -> None:
        """Which of the sample's nodes a rule leaves out of the verdict, told when it starts and
        when it ends, one line per rule (a pool's 500 nodes with DiskPressure are one line)."""
        before, self._left_out = self._left_out, now
        if now == before:
            return
        for event, (old, new) in (("nodes_left_out", (before, now)), ("nodes_left_out_over", (now, before))):
            changed: dict[str, list[str]] = collections.defaultdict(list)
            for name, why in new.items():
                if old.get(name) != why:
                    changed[why].append(name)
            for why, names in sorted(changed.items()):
                level = self.log.debug if why in PACE_REASONS else self.log.info
                level(event, rule=why, nodes=len(names), first=sorted(names)[:5])

    def phase(self, before: Memory, after: Memory, reason: str) -> None:
        status = self.status
        if after.phase is not before.phase or status.phase is not after.phase:
            self.log.info("target_phase", phase=str(after.phase), previous=str(before.phase), reason=reason)
            status.phase, status.phase_reason, status.since_wall = after.phase, reason, self.wall()
            self.metrics.set_phase(self.name, after.phase)
        status.reason = reason

    def decision(self, verdict: Verdict, current: Desired | None, *, dry_run: bool) -> None:
        """The decision to act, logged once: the actuator converges on it over the next ticks."""
        if verdict.desired is current:
            return
        if verdict.desired is Desired.SCALED_DOWN:
            self.log.info("target_scale_down", reason=verdict.reason, dry_run=dry_run)
        elif current is Desired.SCALED_DOWN:
            self.log.info("target_scale_up", reason=verdict.reason)

    def silent_agents(self, now: float, alive: frozenset[str], *, after_s: float) -> None:
        """One Event an episode: agents fail on a path their kubelets prove working. Told once it
        has lasted ``after_s`` (a kubelet read: every kubelet has renewed since), so the count
        is the episode's."""
        if not alive:
            if self._silent_since is not None:
                self.log.info("agents_silent_path_alive_over")
            self._silent_since, self._silent_told = None, False
            return
        if self._silent_since is None:
            self._silent_since = now
        if self._silent_told or now - self._silent_since < after_s:
            return
        self._silent_told = True
        self.log.warning("agents_silent_path_alive", nodes=len(alive), first=sorted(alive)[:5])
        self.event(
            "AgentsSilentPathAlive",
            f"{len(alive)} node(s) stopped renewing their dwd-node-lease leases while their kubelets "
            "keep renewing through the same path: the agents fail, not the path (look for 403, "
            "401 or 500 answers in the agents' logs, OOM kills, a crash loop). They are not "
            f"counted stale: {', '.join(sorted(alive)[:10])}",
        )


def verdict_fields(status: TargetStatus) -> dict[str, Any]:
    """The last verdict as the status page and ``/status`` show it."""
    return {
        "phase": str(status.phase),
        "judging": status.judging,
        "since": status.since_wall,
        "candidates": status.candidates,
        "stale": status.stale,
        "fraction": round(status.fraction, 4),
        "reason": status.reason,
        "phase_reason": status.phase_reason,
        "blocked": str(status.blocked or ""),
        "view": status.view,
        "error": status.error,
        "zones": {
            zone: {"candidates": n, "stale": stale, "fraction": round(stale_fraction(stale, n), 4)}
            for zone, (n, stale) in sorted(status.zones.items())
        },
        "agent_silent_path_alive": sorted(status.path_alive),
    }
