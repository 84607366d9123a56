"""A model of dependency-watchdog's published rule, applied to kubelet leases we observed.

dependency-watchdog v1.7's prober (run for real beside this project: KCM at 0 after 48.0-49.3 s
of a cut at Gardener's settings) probes every ``period_s`` stretched by up to ``jitter``, counts a
kubelet lease expired once ``renewTime + 0.75 x grace`` has passed, and scales MCM and CA down
when at least ``fraction`` of the candidates are expired (never with one candidate); KCM follows
once they are at 0 (its 1 s polls: 1.1 s after MCM when measured). Where the first probe after
the cut falls is chance: the figures are a distribution over that phase. This is a model of the
rule, not the program: no initial delay after a restart, no API latency, no failed probes.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """Gardener's settings for the prober."""

    period_s: float = 30.0
    jitter: float = 0.2
    grace_s: float = 40.0  # KCM's node-monitor grace period, as DWD is told it
    fraction: float = 0.6
    # From MCM and CA at 0 to KCM at 0: DWD waits for the first level, polling every second.
    next_level_s: float = 1.1


def expired_at(renewed_s: float, rule: Rule) -> float:
    """When a lease last renewed at ``renewed_s`` (seconds from the cut) counts expired."""
    return renewed_s + 0.75 * rule.grace_s


def scale_down_at(renewed_s: Sequence[float], phase_s: float, rule: Rule, rng: random.Random) -> float:
    """Seconds from the cut until the probe that scales MCM and CA down, for kubelet leases last
    renewed at ``renewed_s`` (seconds from the cut, negative before it) and the first probe
    ``phase_s`` after the cut; inf when the rule never would (fewer than two candidates)."""
    if len(renewed_s) < 2:
        return math.inf
    expiries = sorted(expired_at(r, rule) for r in renewed_s)
    # The probe must see this many expired: the quorum's last lease.
    quorum = expiries[math.ceil(rule.fraction * len(expiries)) - 1]
    t = phase_s
    while t < quorum:
        t += rule.period_s * (1 + rng.uniform(0, rule.jitter))
    return t


@dataclass(frozen=True)
class Outcome:
    """The rule's KCM-at-0 times over the probe's phase, seconds from the cut."""

    kcm_s: tuple[float, ...]

    @property
    def low(self) -> float:
        return min(self.kcm_s)

    @property
    def median(self) -> float:
        return statistics.median(self.kcm_s)

    @property
    def high(self) -> float:
        return max(self.kcm_s)


def over_phases(
    renewed_s: Sequence[float], rule: Rule = Rule(), *, draws: int = 1000, seed: int = 0
) -> Outcome:
    """The rule's KCM-at-0 time for ``draws`` phases of the first probe, uniform over a period."""
    rng = random.Random(seed)
    times = tuple(
        scale_down_at(renewed_s, rng.uniform(0, rule.period_s), rule, rng) + rule.next_level_s
        for _ in range(draws)
    )
    return Outcome(times)
