"""Which nodes a verdict stands for, and which of their leases it counts: dependency-watchdog's
node rules (candidates.py), the lease's own, and the pace of the fast sample.

A node a rule leaves out is in no verdict, at whatever pace it renews (``skip_reason``); a lease
of a node the rules keep counts once it is asked for the fast interval and seen renewing at it
(``candidates``). Each node left out carries the rule that left it out, as dependency-watchdog
logs of every node it filters.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from aggregator.model.candidates import machine_reason
from aggregator.model.observed import LeaseObs, NodeObs
from aggregator.model.settings import DeciderSettings

EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Eligibility:
    """One walk over the nodes: the leases that count (``candidates``), how many nodes each zone
    has that the verdict stands for at whatever pace (``zones``: what a sample's estimate weighs
    by), and the sample's nodes that do not count with the rule that leaves each out
    (``left_out``: dependency-watchdog logs the same of every node it filters)."""

    candidates: dict[str, LeaseObs]
    zones: collections.Counter[str]
    left_out: dict[str, str]


def eligibility(
    nodes: Mapping[str, NodeObs],
    leases: Mapping[str, LeaseObs],
    now: float,
    params: DeciderSettings,
    sample: Collection[str] | None = None,
    *,
    machines: Mapping[str, str] = EMPTY,
) -> Eligibility:
    """Which leases count: of live, old-enough, not ignored nodes (in the fast-renewing sample,
    when there is one), asked to renew at the fast interval and seen renewed since they were
    asked (released or not). ``machines``: each node's Machine phase, as last read."""
    counted: dict[str, LeaseObs] = {}
    zones: collections.Counter[str] = collections.Counter()
    left_out: dict[str, str] = {}
    for name, node in nodes.items():
        lease = leases.get(name)
        why = skip_reason(node, lease, now, params, machines.get(name))
        if why is None:
            zones[node.view.zone] += 1
        if sample is not None and name not in sample:
            continue
        why = why or _pace_reason(lease, params)
        if why is None and lease is not None:
            counted[name] = lease
        elif why is not None:
            left_out[name] = why
    return Eligibility(counted, zones, left_out)


def candidates(
    nodes: Mapping[str, NodeObs],
    leases: Mapping[str, LeaseObs],
    now: float,
    params: DeciderSettings,
    sample: Collection[str] | None = None,
    *,
    machines: Mapping[str, str] = EMPTY,
) -> dict[str, LeaseObs]:
    """The leases that count (``eligibility``'s)."""
    return eligibility(nodes, leases, now, params, sample, machines=machines).candidates


# The reasons of the pace, not of a rule: a sample member between two intervals. They come
# and go as the sample rotates, where a rule's say something of the node.
NOT_FAST, NOT_YET_FAST = "not asked for the fast interval", "not seen renewing fast since asked"
PACE_REASONS = frozenset({NOT_FAST, NOT_YET_FAST})


def _pace_reason(lease: LeaseObs | None, params: DeciderSettings) -> str | None:
    """Why a lease that the rules keep does not count at its pace (None: it counts)."""
    if lease is None:
        return "no lease yet"
    interval_s = lease.view.interval_s
    if interval_s is None or interval_s > params.fast_interval_s:
        return NOT_FAST
    if lease.seen_renewed_mono <= lease.paced_since_mono:
        return NOT_YET_FAST
    return None


def skip_reason(
    node: NodeObs, lease: LeaseObs | None, now: float, params: DeciderSettings, machine: str | None = None
) -> str | None:
    """Which rule leaves a node out of every verdict, whatever pace it renews at (None: it is
    one the verdict stands for). dependency-watchdog's rules (candidates.py), and the lease's
    own. ``machine``: the phase of the node's Machine (None: none known)."""
    n = node.view
    if n.deleting:
        return "being deleted"
    if n.ignored:
        return "annotated ignore-node"
    if n.unmanaged:
        return "not managed by MCM"
    if (why := machine_reason(machine)) is not None:
        return why
    if n.in_place_update and params.node_conditions is not None:
        return "in-place update"
    if params.node_conditions is not None and (
        bad := params.node_conditions.unhealthy(n.pool, n.true_conditions)
    ):
        return f"an unhealthy condition ({', '.join(bad)})"
    if now - node.created_mono < params.node_grace_s:
        return "younger than the node grace"
    if lease is None:
        return "no lease yet"
    if lease.view.renew_time is None:
        return "its agent has not renewed yet"
    # A lease its agent released stays: leaving the verdict, it would shrink the denominator
    # that the nodes still cut off are counted against (the decider's ``is_stale`` says how long
    # it is healthy).
    return None


def skipped(
    nodes: Mapping[str, NodeObs],
    leases: Mapping[str, LeaseObs],
    now: float,
    params: DeciderSettings,
    machines: Mapping[str, str] = EMPTY,
) -> dict[str, str]:
    """Every node left out of the verdict and why: for the status page, not for each tick."""
    out = {}
    for name, node in nodes.items():
        why = skip_reason(node, leases.get(name), now, params, machines.get(name))
        if why is not None:
            out[name] = why
    return out
