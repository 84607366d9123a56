"""Keeping the heartbeat traffic under a write budget, whatever the cluster size.

Every renewal is a write on KAPI and etcd. Up to ``budget x fast interval``
nodes all renew at the fast interval. Beyond that a sample renews fast and the
rest slowly: the sample is as large as the budget allows (never below
MIN_SAMPLE), so the stale fraction is estimated from it at the same fast pace
as in a small cluster, and detection time does not grow with the cluster.

The sample is drawn per zone (``topology.kubernetes.io/zone``): MIN_PER_ZONE
nodes of each (all of a smaller zone), the rest in proportion to what each zone
has left, so a whole-zone outage is judged with the same precision as a
whole-cluster one, whatever the zones' sizes. Within a zone it is the nodes
with the smallest rank: a hash of the node's name and of the rotation period
it is in. Each node enters a new period at its own moment (an offset from its
name), so the sample rotates a few members at a time, never all at once: a
member gives way within a ROTATION_S, and over time every node takes its turn
at the fast pace (a path that only slow nodes use is sampled too); a node added
or removed moves a zone's boundary by one node at most. Members that leave
stay fast until the ones that replace them have been seen renewing at the fast
pace (``hand_over``): the sample is never short while it rotates.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

MIN_SAMPLE = 20
# A zone's share of the sample never falls below this (a smaller zone is sampled whole):
# fewer than MIN_SAMPLE would make a verdict on that zone alone a guess.
MIN_PER_ZONE = MIN_SAMPLE
ROTATION_S = 3600.0
# How often a target re-plans while its nodes stay the same: the rotation's pace, and how
# long a member that handed over stays fast after its successor was seen renewing.
REPLAN_S = 10.0
# The slow intervals handed out: at least a minute (a slow lease must still show the
# node is alive), at most the 5 minutes the agent accepts (agent/settings.py).
SLOW_INTERVALS_S = (60.0, 120.0, 300.0)


@dataclass(frozen=True)
class Pacing:
    fast: frozenset[str]
    fast_interval_s: float
    slow_interval_s: float
    # Each node's zone ("" when its Node has no zone label).
    zones: Mapping[str, str] = field(default_factory=dict)

    def interval_s(self, node: str) -> float:
        return self.fast_interval_s if node in self.fast else self.slow_interval_s

    def writes_per_s(self, n_nodes: int) -> float:
        k = len(self.fast)
        return k / self.fast_interval_s + (n_nodes - k) / self.slow_interval_s


def _hash(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _rank(node: str, now_s: float | None) -> bytes:
    """The node's place in the sample order: fixed without a clock, else re-drawn once per
    ROTATION_S at the node's own offset into the period."""
    if now_s is None:
        return _hash(node)
    offset = int.from_bytes(_hash("rotation-offset:" + node)[:8], "big") / 2**64 * ROTATION_S
    period = int((now_s + offset) // ROTATION_S)
    return _hash(f"{period}:{node}")


def plan(
    nodes: Iterable[str],
    fast_interval_s: float,
    budget_per_s: float,
    zones: Mapping[str, str] | None = None,
    now_s: float | None = None,
) -> Pacing:
    """``now_s`` (wall clock): the sample rotates with it; without it the sample is fixed."""
    names = sorted(set(nodes), key=lambda node: _rank(node, now_s))
    zone_of = {name: (zones or {}).get(name, "") for name in names}
    n = len(names)
    if n <= budget_per_s * fast_interval_s:
        return Pacing(frozenset(names), fast_interval_s, fast_interval_s, zone_of)
    # Slow nodes take at most half the budget (the longest interval when even that is
    # not enough), the sample gets the rest.
    slow_s = next((s for s in SLOW_INTERVALS_S if n / s <= budget_per_s / 2), SLOW_INTERVALS_S[-1])
    k = int((budget_per_s - n / slow_s) / (1 / fast_interval_s - 1 / slow_s))
    k = max(min(n, MIN_SAMPLE), min(k, n))
    by_zone: dict[str, list[str]] = {}
    for name in names:  # in rank order, so each zone's list is too
        by_zone.setdefault(zone_of[name], []).append(name)
    shares = allocate(k, {z: len(members) for z, members in by_zone.items()})
    fast = frozenset(name for z, members in by_zone.items() for name in members[: shares[z]])
    return Pacing(fast, fast_interval_s, slow_s, zone_of)


def allocate(k: int, sizes: Mapping[str, int]) -> dict[str, int]:
    """Split a sample of ``k`` over zones of these sizes: MIN_PER_ZONE each (a smaller zone
    whole), the rest in proportion to size by largest remainder. The total exceeds ``k`` only
    when the minimums alone do."""
    shares = {z: min(size, MIN_PER_ZONE) for z, size in sizes.items()}
    rest = k - sum(shares.values())
    room = {z: size - shares[z] for z, size in sizes.items()}
    total_room = sum(room.values())
    if rest <= 0 or total_room == 0:
        return shares
    rest = min(rest, total_room)
    exact = {z: rest * r / total_room for z, r in room.items()}
    for z, x in exact.items():
        shares[z] += math.floor(x)
    left = rest - sum(math.floor(x) for x in exact.values())
    # Ties broken by zone name: the same nodes get the same sample on every replan.
    for z in sorted(exact, key=lambda z: (-(exact[z] - math.floor(exact[z])), z))[:left]:
        shares[z] += 1
    return shares


def hand_over(wanted: Pacing, previous: frozenset[str], ready: Callable[[str], bool]) -> Pacing:
    """``wanted``, with members of the ``previous`` sample that it drops kept fast until as
    many of the members it adds, zone by zone, are ``ready`` (seen renewing at the fast
    pace): a rotating sample never judges fewer nodes than it should."""
    if wanted.slow_interval_s == wanted.fast_interval_s:
        return wanted
    # A member asked for the fast pace is not yet judged: a slow node reads its new interval
    # only from its next (slow) renewal's answer.
    waiting: dict[str, int] = {}
    for name in wanted.fast:
        if not ready(name):
            zone = wanted.zones.get(name, "")
            waiting[zone] = waiting.get(zone, 0) + 1
    kept = []
    # Only a leaving member that is judged now fills a gap: one still waiting itself does not.
    for name in sorted(n for n in previous - wanted.fast if ready(n)):
        where = wanted.zones.get(name)
        if where is not None and waiting.get(where, 0) > 0:
            waiting[where] -= 1
            kept.append(name)
    return replace(wanted, fast=wanted.fast | frozenset(kept)) if kept else wanted
