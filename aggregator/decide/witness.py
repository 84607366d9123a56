"""The second witness: the kubelet's own lease, read when an agent falls silent.

A kubelet renewal is placed on our clock by the two LISTs that bracket it (narrowed by the
node's own clock where that agrees), and a candidate whose agent went quiet is **silent**
once a read sent after its kubelet's next renewal was due still shows the same renewal,
**alive** when its kubelet renewed after the agent went quiet, **pending** until then. Only
silent nodes count towards a scale-down. The rule and why each step is there:
docs/decision.md, "The second witness". This module is the rule alone: the decider imports
it, and a verdict does no I/O (tests/unit/test_layers.py); the reads are
aggregator/observe/kubelets.py's, what they saw aggregator/model/observed.py's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from aggregator.model.observed import (
    KUBELET_JITTER,
    KUBELET_LEASE_DURATION_S,
    KUBELET_RENEW_FRACTION,
    KubeletObs,
    Readings,
)


@dataclass(frozen=True)
class Witness:
    """What the kubelets say of the stale candidates: ``alive`` renewed after their agents went
    quiet; ``pending`` (name -> when, on our clock) cannot tell before their next renewal is
    due; every other stale candidate is silent to both."""

    alive: frozenset[str] = frozenset()
    pending: Mapping[str, float] = field(default_factory=dict)
    # When each alive one's kubelet is due to renew again (our clock).
    alive_due: Mapping[str, float] = field(default_factory=dict)

    def silent_by(self, stale: frozenset[str], at: float) -> frozenset[str]:
        """The stale candidates a read sent at ``at`` would find silent (or found, when ``at``
        is when the last read was sent): neither alive nor due after ``at``."""
        return frozenset(n for n in stale - self.alive if self.pending.get(n, -math.inf) <= at)


def kubelet_says(
    agent_renew_time: datetime | None,
    agent_seen_mono: float,
    kubelet: KubeletObs | None,
    read_at: float,
    *,
    margin_s: float,
    slack_s: float,
    bracket_s: float = math.inf,
) -> tuple[str, float]:
    """One stale candidate: ("alive" | "silent" | "pending", when its kubelet's next renewal is
    due on our clock). No kubelet lease, or no renewal in it, leaves the agent's verdict as it
    is: silent."""
    if kubelet is None or kubelet.renew_time is None:
        return "silent", -math.inf
    placed = place(agent_renew_time, agent_seen_mono, kubelet, slack_s, bracket_s)
    due = (
        (kubelet.seen_renewed_mono if placed is None else placed)
        + kubelet.interval_s * (1 + KUBELET_JITTER)
        + slack_s
    )
    if read_at >= due:
        return "silent", due  # it missed the renewal it was due to make before that read
    if (kubelet.unseen_at if placed is None else placed) - agent_seen_mono > margin_s:
        return "alive", due
    return "pending", due


def place(
    agent_renew_time: datetime | None,
    agent_seen_mono: float,
    kubelet: KubeletObs,
    slack_s: float,
    bracket_s: float = math.inf,
) -> float | None:
    """When the kubelet renewed, on our clock, by the node's own clock within the bracket of our
    reads; None where the node's clock cannot be trusted for it: no bracket, or one wider than
    ``bracket_s`` (reads that stopped for a while: a step smaller than such a gap would pass
    unseen), no agent renewal to measure from, or a phase outside the bracket by more than the
    slack (the node's clock stepped)."""
    if agent_renew_time is None or kubelet.renew_time is None or kubelet.unseen_at == -math.inf:
        return None
    if kubelet.seen_renewed_mono - kubelet.unseen_at > bracket_s:
        return None
    phase = agent_seen_mono + (kubelet.renew_time - agent_renew_time).total_seconds()
    if not kubelet.unseen_at - slack_s <= phase <= kubelet.seen_renewed_mono + slack_s:
        return None
    return min(max(phase, kubelet.unseen_at), kubelet.seen_renewed_mono)


def witness(
    stale: Mapping[str, tuple[datetime | None, float]],
    readings: Readings | None,
    *,
    margin_s: float,
    slack_s: float,
    bracket_s: float = math.inf,
) -> Witness:
    """Of the stale candidates (name -> their agent's last renewTime and when we saw it), what
    their kubelets say. ``readings`` None: the kubelet leases may not be read, every stale
    candidate stays as its agent says. Before any read, each is pending until a whole kubelet
    interval and the margin after its agent's last renewal."""
    if readings is None:
        return Witness()
    alive, pending, alive_due = set(), {}, {}
    for name, (renewed, seen) in stale.items():
        kubelet = readings.leases.get(name)
        if kubelet is None and readings.read_at == -math.inf:
            interval_s = KUBELET_LEASE_DURATION_S * KUBELET_RENEW_FRACTION
            pending[name] = seen + margin_s + interval_s * (1 + KUBELET_JITTER) + slack_s
            continue
        says, due = kubelet_says(
            renewed, seen, kubelet, readings.read_at, margin_s=margin_s, slack_s=slack_s, bracket_s=bracket_s
        )
        if says == "alive":
            alive.add(name)
            alive_due[name] = due
        elif says == "pending":
            pending[name] = due
    return Witness(frozenset(alive), pending, alive_due)
