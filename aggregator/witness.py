"""The second witness: the kubelet's own lease, read when an agent falls silent.

The agents can fail on a path that works: their RoleBinding pruned (403), a broken
webhook (500), an OOM kill on every node at once, a bad rollout. Alone, they would
then scale a healthy shoot down and hold it there. Meanwhile each kubelet keeps
renewing ``kube-node-lease/<node>`` through the same path, and that lease is what
KCM judges.

For a candidate whose agent went silent at A (its last renewal), with its kubelet's
latest renewal K as last read (``witness``):
- the kubelet's next renewal is due at K + its interval (a quarter of the kubelet
  lease's duration, 10 s in Gardener; plus kubelet's jitter and ``Decider.witness_slack_s``
  for the renewal to land): a read sent after that which still shows K says the
  kubelet missed it: the node is **silent** to both witnesses;
- otherwise, a K more than the agent's interval and a second after A
  (``Decider.witness_margin_s``) reached KAPI after the agent went quiet: the path
  works, the agent does not (**alive**);
- otherwise it is **pending** until that next renewal is due: whether the path works
  is known only then. A scale-down counts only silent nodes, so it waits for the read
  that tells, at any kubelet phase and any setting.
Both renewal times are the node's own clock, so its skew cancels; where a renewal is
due is put on our clock from when we saw the agent's last renewal (``LeaseObs``),
which is later than it was written: the due time errs late, never early.

Kubelet leases change every 10 s per node (500 writes/s at 5000 nodes), so they are
not watched: they are LISTed when a candidate is stale or the shoot is not healthy,
every ``Decider.witness_every_s``, and once more right before a scale-down
(aggregator/kubelets.py). This module is the rule alone: the decider imports it, and a
verdict does no I/O (tests/unit/test_layers.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aggregator.objects import metadata, section
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


@dataclass(frozen=True)
class Readings:
    """The kubelet leases as last read, and when that read was sent (our clock): a renewal due
    before then would have shown in it. ``read_at`` is -inf before the first read."""

    leases: Mapping[str, KubeletObs] = field(default_factory=dict)
    read_at: float = -math.inf


def observe(items: list[Any], before: Mapping[str, KubeletObs], now: float) -> dict[str, KubeletObs]:
    """The kubelet leases of one LIST (``items``), each renewal first seen at ``now`` unless
    ``before`` already showed it."""
    seen: dict[str, KubeletObs] = {}
    for obj in items:
        name = metadata(obj).get("name")
        if not isinstance(name, str):
            continue
        spec = section(obj, "spec")
        renew = micro_time(spec.get("renewTime"))
        known = before.get(name)
        first_seen = known.seen_renewed_mono if known is not None and known.renew_time == renew else now
        seen[name] = KubeletObs(renew, first_seen, _interval_s(spec.get("leaseDurationSeconds")))
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
) -> tuple[str, float]:
    """One stale candidate: ("alive" | "silent" | "pending", when its kubelet's next renewal is
    due on our clock). No kubelet lease, no renewal in it, or an agent renewal that cannot be
    read leaves the agent's verdict as it is: silent."""
    if kubelet is None or kubelet.renew_time is None or agent_renew_time is None:
        return "silent", -math.inf
    after_agent_s = (kubelet.renew_time - agent_renew_time).total_seconds()
    due = agent_seen_mono + after_agent_s + kubelet.interval_s * (1 + KUBELET_JITTER) + slack_s
    if read_at >= due:
        return "silent", due  # it missed the renewal it was due to make before that read
    if after_agent_s > margin_s:
        return "alive", due
    return "pending", due


def witness(
    stale: Mapping[str, tuple[datetime | None, float]],
    readings: Readings | None,
    *,
    margin_s: float,
    slack_s: float,
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
        says, due = kubelet_says(renewed, seen, kubelet, readings.read_at, margin_s=margin_s, slack_s=slack_s)
        if says == "alive":
            alive.add(name)
        elif says == "pending":
            pending[name] = due
    return Witness(frozenset(alive), pending)
