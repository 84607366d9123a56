"""What was observed of a shoot, on our own monotonic clock: its nodes, their leases, and the
kubelets' leases the second witness reads.

The readers (aggregator/observe/watcher.py, aggregator/observe/kubelets.py) make these; the
decision (aggregator/decide/) judges them. Staleness is measured where it is observed, never
from a node's own clock: each observation carries when we saw it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aggregator.model.objects import NodeView, metadata, section
from core.lease import LeaseView, parse_micro_time

NODE_LEASE_NAMESPACE = "kube-node-lease"
# kubelet renews every quarter of its lease's duration (nodeLeaseDurationSeconds, 40 s by
# default), each wait stretched by up to 4 % (wait.JitterUntil's jitter in its lease controller).
KUBELET_RENEW_FRACTION = 0.25
KUBELET_JITTER = 0.04
KUBELET_LEASE_DURATION_S = 40.0


@dataclass(frozen=True)
class NodeObs:
    view: NodeView
    # Our own monotonic clock at the node's creation (its age as the server's clock tells it).
    created_mono: float


@dataclass(frozen=True)
class LeaseObs:
    view: LeaseView
    # Our own monotonic time when renew_time was last seen to change (or first seen).
    seen_renewed_mono: float
    # When the aggregator first saw the interval the lease asks for now. A renewal seen
    # after that moment is one made at that pace: the agent adopts the interval from its
    # PATCH response.
    paced_since_mono: float = float("-inf")


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
