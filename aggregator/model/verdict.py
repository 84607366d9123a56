"""What the decision says, in the words its readers share: the phase a target is in (``Phase``),
what the dependents should be (``Desired``), what the decider remembers between ticks
(``Memory``) and one tick's ``Verdict``, with what it rests on.

The rules that make them are aggregator/decide/'s (docs/decision.md); the actuator, the
reports and the metrics read them from here, so none of those imports the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Phase(StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    CONFIRMING = "confirming"
    DOWN = "scaled-down"
    RECOVERING = "recovering"


class Desired(StrEnum):
    """What the dependents should be: the actuator's goal."""

    RUNNING = "running"
    SCALED_DOWN = "scaled-down"
    # Leave every dependent as it is: a start resumed from records of ours, no verdict yet.
    HOLD = "hold"


@dataclass(frozen=True)
class Memory:
    """What the decider remembers between ticks."""

    phase: Phase
    since: float
    # Scaled down and unable to see anything since then (None: can see).
    blind_since: float | None = None
    # Resumed from records of ours at a start: nothing moves until a fresh verdict.
    held: bool = False


@dataclass(frozen=True)
class Verdict:
    memory: Memory
    candidates: int
    stale: int
    reason: str
    # A quorum was judged this tick (False: starting, blind, or too few candidates).
    judged: bool = False
    # This tick enters scaled-down: the interlocks run first and may refuse (``blocked``).
    scale_down: bool = False
    # The stratified estimate of the stale fraction when a sample is judged (None: s / n).
    estimate: float | None = None
    # Candidates and stale ones per zone: what an operator reads a zone outage from.
    zones: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Candidates whose agent is silent while their kubelet proves the path (aggregator/decide/witness.py):
    # not counted stale.
    path_alive: frozenset[str] = frozenset()
    # Stale candidates whose kubelet cannot tell yet whether the path works (its next renewal is
    # not due): counted stale while confirming, but a scale-down waits for them.
    pending: int = 0
    # When a look before the next whole tick can change the verdict (our clock): the first of
    # those kubelets' next renewal due, the failure fraction reached if nothing renews, the
    # confirm period ended (None: none of them before the next tick).
    wake_at: float | None = None
    # The sample's nodes that do not count, and the rule that leaves each out.
    left_out: Mapping[str, str] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return self.estimate if self.estimate is not None else stale_fraction(self.stale, self.candidates)

    @property
    def desired(self) -> Desired | None:
        return desired_for(self.memory)


def stale_fraction(stale: int, candidates: int) -> float:
    """The share of candidates that are stale; 0 when there are none (no verdict, not an outage)."""
    return stale / candidates if candidates else 0.0


def desired_for(memory: Memory) -> Desired | None:
    phase = memory.phase
    if phase is Phase.STARTING:
        return None  # not known until the record in the annotations has been read
    if memory.held:
        return Desired.HOLD
    if phase in (Phase.DOWN, Phase.RECOVERING):
        return Desired.SCALED_DOWN
    return Desired.RUNNING
