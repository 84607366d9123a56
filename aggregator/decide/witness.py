"""The second witness: the kubelet's own lease, read when an agent falls silent.

A kubelet renewal is placed on our clock by the two LISTs that bracket it (narrowed by the
node's own clock where that agrees), and a candidate whose agent went quiet is **silent**
once a read sent after its kubelet's next renewal was due still shows the same renewal,
**alive** when its kubelet renewed after the agent went quiet, **pending** until then. Only
silent nodes count towards a scale-down. The rule and why each step is there:
docs/decision.md, "The second witness". This module is the rule alone: the decider imports
it, and a verdict does no I/O (tests/unit/test_layers.py); the reads are
aggregator/observe/kubelets.py's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aggregator.model.objects import metadata, section
from core.lease import parse_micro_time

NODE_LEASE_NAMESPACE = "kube-node-lease"
# kubelet renews every quarter of its lease's duration (nodeLeaseDurationSeconds, 40 s by
# default), each wait stretched by up to 4 % (wait.JitterUntil's jitter in its lease controller).
KUBELET_RENEW_FRACTION = 0.25
KUBELET_JITTER = 0.04
KUBELET_LEASE_DURATION_S = 40.0


@dataclass(frozen=True)
class KubeletObs:
    """A kubelet's lease as last LISTed."""

    renew_time: datetime | None  # the node's clock
    # Our monotonic clock when a LIST showed renew_time changed (or first showed it).
    seen_renewed_mono: float
    # How often this kubelet renews: a quarter of its lease's duration.
    interval_s: float = KUBELET_LEASE_DURATION_S * KUBELET_RENEW_FRACTION
    # When the last read that did not show this renewal was sent (our clock): the renewal came
    # after it. -inf: this renewal was in the first read that showed the lease.
    unseen_at: float = -math.inf


@dataclass(frozen=True)
class Readings:
    """The kubelet leases as last read, and when that read was sent (our clock): a renewal due
    before then would have shown in it. ``read_at`` is -inf before the first read."""

    leases: Mapping[str, KubeletObs] = field(default_factory=dict)
    read_at: float = -math.inf


def observe(items: list[Any], before: Readings, now: float) -> dict[str, KubeletObs]:
    """The kubelet leases of one LIST (``items``), answered at ``now``: each renewal first seen
    now, after the read ``before`` (which did not show it), unless ``before`` already showed it."""
    seen: dict[str, KubeletObs] = {}
    for obj in items:
        name = metadata(obj).get("name")
        if not isinstance(name, str):
            continue
        spec = section(obj, "spec")
        renew = micro_time(spec.get("renewTime"))
        known = before.leases.get(name)
        if known is not None and known.renew_time == renew:
            seen[name] = known
            continue
        # A lease the last read did not list at all was created after it too.
        unseen_at = before.read_at if known is not None or before.read_at > -math.inf else -math.inf
        seen[name] = KubeletObs(renew, now, _interval_s(spec.get("leaseDurationSeconds")), unseen_at)
    return seen


def _interval_s(duration: object) -> float:
    """kubelet's renew interval from its lease's duration (the default where it is absent)."""
    seconds = duration if isinstance(duration, int) and duration > 0 else KUBELET_LEASE_DURATION_S
    return float(seconds) * KUBELET_RENEW_FRACTION


def micro_time(text: object) -> datetime | None:
    """A lease's renewTime; None when absent or not a MicroTime."""
    if not isinstance(text, str):
        return None
    try:
        return parse_micro_time(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Witness:
    """What the kubelets say of the stale candidates: ``alive`` renewed after their agents went
    quiet; ``pending`` (name -> when, on our clock) cannot tell before their next renewal is
    due; every other stale candidate is silent to both."""

    alive: frozenset[str] = frozenset()
    pending: Mapping[str, float] = field(default_factory=dict)

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
    alive, pending = set(), {}
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
        elif says == "pending":
            pending[name] = due
    return Witness(frozenset(alive), pending)
