"""The second witness: the kubelet's own lease, read when an agent falls silent.

The agents can fail on a path that works: their RoleBinding pruned (403), a broken
webhook (500), an OOM kill on every node at once, a bad rollout. Alone, they would
then scale a healthy shoot down and hold it there. Meanwhile each kubelet keeps
renewing ``kube-node-lease/<node>`` through the same path, and that lease is what
KCM judges. A node whose kubelet renewed later than its agent did, by more than
the agent's interval and a second, reached KAPI after its agent went quiet: the
path works, the agent does not. Both times are the node's own clock, so its skew
cancels; how recent the kubelet's renewal is, is judged on our clock, from when a
LIST showed it changing (``KubeletObs.seen_renewed_mono``).

Kubelet leases change every 10 s per node (500 writes/s at 5000 nodes), so they are
not watched: they are LISTed when a candidate is stale or the shoot is not healthy,
every ``Decider.witness_every_s``, and once more right before a scale-down.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from aggregator.objects import metadata, section
from core.errors import BadResponse
from core.lease import leases_path, parse_micro_time

if TYPE_CHECKING:  # the decider imports this module and must stay free of I/O
    from aggregator.kube import KubeClient

NODE_LEASE_NAMESPACE = "kube-node-lease"


@dataclass(frozen=True)
class KubeletObs:
    """A kubelet's lease as last LISTed."""

    renew_time: datetime | None  # the node's clock
    # Our monotonic clock when a LIST showed renew_time changed (or first showed it).
    seen_renewed_mono: float


class KubeletLeases:
    """``kube-node-lease`` by LIST, and when each renewal was first seen."""

    def __init__(self, shoot: KubeClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.shoot = shoot
        self.clock = clock
        self.leases: dict[str, KubeletObs] = {}
        self.read_at = float("-inf")
        self.error = ""

    def due(self, every_s: float) -> bool:
        return self.clock() - self.read_at >= every_s

    async def read(self) -> None:
        """One LIST; what it shows replaces what was known. Errors are the caller's: the old
        observations stay, and age out by their own ``seen_renewed_mono``."""
        result = await self.shoot.get(leases_path(NODE_LEASE_NAMESPACE))
        items = result.get("items")
        if not isinstance(items, list):
            raise BadResponse(f"LIST {leases_path(NODE_LEASE_NAMESPACE)}: no items")
        now = self.clock()
        seen: dict[str, KubeletObs] = {}
        for obj in items:
            name = metadata(obj).get("name")
            if not isinstance(name, str):
                continue
            renew = micro_time(section(obj, "spec").get("renewTime"))
            before = self.leases.get(name)
            unchanged = before is not None and before.renew_time == renew
            seen[name] = KubeletObs(renew, before.seen_renewed_mono if unchanged and before else now)
        self.leases, self.read_at, self.error = seen, now, ""


def micro_time(text: object) -> datetime | None:
    """A lease's renewTime; None when absent or not a MicroTime."""
    if not isinstance(text, str):
        return None
    try:
        return parse_micro_time(text)
    except ValueError:
        return None


def path_alive(
    agent_renew_time: str | None,
    kubelet: KubeletObs | None,
    now: float,
    *,
    margin_s: float,
    fresh_s: float,
) -> bool:
    """Whether the node's kubelet proves the path while its agent is silent: renewed more than
    ``margin_s`` after the agent's last renewal (the node's clock, both), and seen renewing by
    us within ``fresh_s`` (our clock: a kubelet that renewed once and then fell silent too is
    no proof that the path works now)."""
    if kubelet is None or kubelet.renew_time is None:
        return False
    agent = micro_time(agent_renew_time)
    if agent is None:
        return False
    return (
        kubelet.renew_time - agent
    ).total_seconds() > margin_s and now - kubelet.seen_renewed_mono <= fresh_s


def witnesses(
    stale: Mapping[str, str | None],
    kubelets: Mapping[str, KubeletObs],
    now: float,
    *,
    margin_s: float,
    fresh_s: float,
) -> frozenset[str]:
    """Of the stale nodes (name -> their agent's last renewTime), those whose path is alive."""
    return frozenset(
        name
        for name, renewed in stale.items()
        if path_alive(renewed, kubelets.get(name), now, margin_s=margin_s, fresh_s=fresh_s)
    )
