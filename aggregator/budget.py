"""Keeping the heartbeat traffic under a write budget, whatever the cluster size.

Every renewal is a write on KAPI and etcd. Up to ``budget x fast interval``
nodes all renew at the fast interval. Beyond that a sample renews fast and the
rest slowly: the sample is as large as the budget allows (never below
MIN_SAMPLE), so the stale fraction is estimated from it at the same fast pace
as in a small cluster, and detection time does not grow with the cluster.

The sample is the nodes with the smallest hash of their name: stable, so a
node does not flip between paces, and spread evenly over pools and zones by
the hash. A node added or removed moves the boundary by one node at most.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

MIN_SAMPLE = 20
# The slow intervals handed out: at least a minute (a slow lease must still show the
# node is alive), at most the 5 minutes the agent accepts (agent/settings.py).
SLOW_INTERVALS_S = (60.0, 120.0, 300.0)


@dataclass(frozen=True)
class Pacing:
    fast: frozenset[str]
    fast_interval_s: float
    slow_interval_s: float

    def interval_s(self, node: str) -> float:
        return self.fast_interval_s if node in self.fast else self.slow_interval_s

    def writes_per_s(self, n_nodes: int) -> float:
        k = len(self.fast)
        return k / self.fast_interval_s + (n_nodes - k) / self.slow_interval_s


def _rank(node: str) -> bytes:
    return hashlib.sha256(node.encode()).digest()


def plan(nodes: Iterable[str], fast_interval_s: float, budget_per_s: float) -> Pacing:
    names = sorted(set(nodes), key=_rank)
    n = len(names)
    if n <= budget_per_s * fast_interval_s:
        return Pacing(frozenset(names), fast_interval_s, fast_interval_s)
    # Slow nodes take at most half the budget (the longest interval when even that is
    # not enough), the sample gets the rest.
    slow_s = next((s for s in SLOW_INTERVALS_S if n / s <= budget_per_s / 2), SLOW_INTERVALS_S[-1])
    k = int((budget_per_s - n / slow_s) / (1 / fast_interval_s - 1 / slow_s))
    k = max(min(n, MIN_SAMPLE), min(k, n))
    return Pacing(frozenset(names[:k]), fast_interval_s, slow_s)
