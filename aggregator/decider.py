"""The decision: a pure function of what was observed and ``now`` (monotonic seconds).

No I/O and no clock reads, so every rule is testable to the millisecond.

Phases:
  healthy     -> confirming  when stale/candidates >= failure fraction
  confirming  -> down        after confirm period still at or above it  (action: scale_down)
  confirming  -> healthy     when it drops below
  down        -> recovering  when stale/candidates < recovery fraction
  recovering  -> down        when it rises to the recovery fraction again
  recovering  -> healthy     after recovery period still below it       (action: scale_up)
Fewer than min_candidates (but some): hold the phase, do nothing.
Zero candidates: nothing can be judged, so make sure the controllers run (action: scale_up).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Phase(StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    CONFIRMING = "confirming"
    DOWN = "scaled-down"
    RECOVERING = "recovering"


class Action(StrEnum):
    NONE = "none"
    SCALE_DOWN = "scale_down"
    SCALE_UP = "scale_up"


@dataclass(frozen=True)
class NodeObs:
    name: str
    created_mono: float
    deleting: bool = False
    ignored: bool = False
    unhealthy: bool = False


@dataclass(frozen=True)
class LeaseObs:
    name: str
    renew_time: str | None
    # Our own monotonic time when renew_time was last seen to change (or first seen).
    seen_renewed_mono: float
    released: bool = False
    # When its renew-interval annotation was last seen to change: until the agent
    # has renewed since, it may still be on its old, slower pace.
    paced_since_mono: float = float("-inf")
    interval: str | None = None


@dataclass(frozen=True)
class Params:
    lease_duration_s: float
    node_grace_s: float
    failure_fraction: float
    recovery_fraction: float
    confirm_period_s: float
    recovery_period_s: float
    min_candidates: int


@dataclass(frozen=True)
class Memory:
    """What the decider remembers between ticks."""

    phase: Phase
    since: float


@dataclass(frozen=True)
class Verdict:
    action: Action
    memory: Memory
    candidates: int
    stale: int
    reason: str
    stale_nodes: tuple[str, ...] = field(default=())

    @property
    def fraction(self) -> float:
        return self.stale / self.candidates if self.candidates else 0.0


def candidates(
    nodes: Mapping[str, NodeObs],
    leases: Mapping[str, LeaseObs],
    now: float,
    p: Params,
    sample: Collection[str] | None = None,
) -> dict[str, LeaseObs]:
    """The leases that count: of live, old-enough, not ignored nodes (in the fast-renewing
    sample, when there is one), renewed at least once and since their pace last changed,
    not released."""
    out = {}
    for name, node in nodes.items():
        if node.deleting or node.ignored or node.unhealthy or now - node.created_mono < p.node_grace_s:
            continue
        if sample is not None and name not in sample:
            continue
        lease = leases.get(name)
        if lease is None or lease.renew_time is None or lease.released:
            continue
        if lease.seen_renewed_mono < lease.paced_since_mono:
            continue
        out[name] = lease
    return out


def is_stale(lease: LeaseObs, now: float, p: Params) -> bool:
    return now - lease.seen_renewed_mono >= p.lease_duration_s


def decide(
    nodes: Mapping[str, NodeObs],
    leases: Mapping[str, LeaseObs],
    now: float,
    p: Params,
    memory: Memory,
    *,
    sample: Collection[str] | None = None,
) -> Verdict:
    counted = candidates(nodes, leases, now, p, sample)
    stale = tuple(sorted(n for n, lease in counted.items() if is_stale(lease, now, p)))
    n, s = len(counted), len(stale)
    fraction = s / n if n else 0.0

    def verdict(action: Action, phase: Phase, reason: str) -> Verdict:
        mem = memory if phase == memory.phase else Memory(phase, now)
        return Verdict(action, mem, n, s, reason, stale)

    phase = memory.phase
    if phase is Phase.STARTING:
        return verdict(Action.NONE, phase, "starting: waiting one lease duration before judging")
    if n == 0:
        if phase in (Phase.DOWN, Phase.RECOVERING):
            return verdict(
                Action.SCALE_UP, Phase.HEALTHY, "no candidates: nothing to judge, controllers must run"
            )
        return verdict(Action.NONE, Phase.HEALTHY, "no candidates")
    if n < p.min_candidates:
        return Verdict(
            Action.NONE, memory, n, s, f"{n} candidate(s), fewer than {p.min_candidates}: no verdict", stale
        )

    at_failure = fraction >= p.failure_fraction
    below_recovery = fraction < p.recovery_fraction
    ratio = f"{s}/{n} stale ({fraction:.0%})"
    if phase is Phase.HEALTHY:
        if at_failure:
            return verdict(Action.NONE, Phase.CONFIRMING, f"{ratio} >= {p.failure_fraction:.0%}: confirming")
        return verdict(Action.NONE, Phase.HEALTHY, ratio)
    if phase is Phase.CONFIRMING:
        if not at_failure:
            return verdict(Action.NONE, Phase.HEALTHY, f"{ratio}: below the failure fraction again")
        if now - memory.since >= p.confirm_period_s:
            return verdict(
                Action.SCALE_DOWN, Phase.DOWN, f"{ratio} for {now - memory.since:.1f}s: quorum lost"
            )
        return verdict(Action.NONE, Phase.CONFIRMING, f"{ratio}: confirming")
    if phase is Phase.DOWN:
        if below_recovery:
            return verdict(Action.NONE, Phase.RECOVERING, f"{ratio} < {p.recovery_fraction:.0%}: recovering")
        return verdict(Action.NONE, Phase.DOWN, ratio)
    # RECOVERING
    if not below_recovery:
        return verdict(Action.NONE, Phase.DOWN, f"{ratio}: at the recovery fraction again")
    if now - memory.since >= p.recovery_period_s:
        return verdict(Action.SCALE_UP, Phase.HEALTHY, f"{ratio} for {now - memory.since:.1f}s: recovered")
    return verdict(Action.NONE, Phase.RECOVERING, f"{ratio}: recovering")
