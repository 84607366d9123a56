"""The decision: a pure function of what was observed, what the aggregator could see, and ``now``.

No I/O and no clock reads, so every rule is testable to the millisecond. A tick's steps are
here: the leases that count (aggregator/model/eligibility.py), the stale ones as both witnesses
tell them (witness), the fraction judged (estimate), and when to look again; where the phase goes
on that is the phase machine's (phases).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from aggregator.decide.estimate import fraction, per_zone, stratified
from aggregator.decide.phases import Quorum, judge
from aggregator.decide.witness import Witness, witness
from aggregator.model.eligibility import EMPTY, eligibility
from aggregator.model.observed import LeaseObs, NodeObs, Readings, micro_time
from aggregator.model.settings import DeciderSettings
from aggregator.model.verdict import Memory, Phase, Verdict, stale_fraction


def is_stale(lease: LeaseObs, now: float, params: DeciderSettings, *, answered: bool = False) -> bool:
    return now >= stale_at(lease, params, answered=answered)


def stale_at(lease: LeaseObs, params: DeciderSettings, *, answered: bool = False) -> float:
    """When a lease not renewed again turns stale (our clock). A release (a roll, a drain) says
    nothing of the path, so one its agent released is judged by its kubelet alone: where the
    second witness can answer for the node (``answered``: its kubelet's lease read, a renewal in
    it), after a lease duration like any other, and then it counts only while its kubelet is
    silent too (``decide``); where the witness cannot answer yet, after the roll allowance; and
    without a witness, never (``_stale``)."""
    wait = params.roll_allowance_s if lease.view.released and not answered else params.lease_duration_s
    return lease.seen_renewed_mono + wait


def answerable(counted: Mapping[str, LeaseObs], kubelets: Readings | None) -> frozenset[str]:
    """The released candidates the second witness can answer for now: read, with a renewal."""
    if kubelets is None or kubelets.read_at == -math.inf:
        return frozenset()
    return frozenset(
        n
        for n, lease in counted.items()
        if lease.view.released and (k := kubelets.leases.get(n)) is not None and k.renew_time is not None
    )


@dataclass(frozen=True)
class Look:
    """What one verdict is given: the view, the evidence beside it, the settings, the clock.

    ``view_since``: since when the aggregator's view of the shoot has been fresh without a
    gap (None: it is not fresh now). ``records``: whether a dependent carries the record of
    a scale-down (read while starting; None: not read yet). ``sample``: the fast-renewing
    sample, where there is one. ``kubelets``: the kubelet leases as last LISTed, the second
    witness (None: they may not be read, the agents' verdict stands). ``machines``: each node's
    Machine phase as last read (empty: none known, no node is left out for its Machine).
    ``confirming``: this verdict confirms a scale-down on the interlocks' fresh reads, and
    counts silent only what their kubelet read showed silent (a tick's verdict counts on the
    read the interlocks send after it)."""

    nodes: Mapping[str, NodeObs]
    leases: Mapping[str, LeaseObs]
    now: float
    params: DeciderSettings
    memory: Memory
    view_since: float | None
    records: bool | None = None
    sample: Collection[str] | None = None
    kubelets: Readings | None = None
    machines: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    confirming: bool = False


def decide(look: Look) -> Verdict:
    """One tick."""
    now, params, kubelets = look.now, look.params, look.kubelets
    walk = eligibility(look.nodes, look.leases, now, params, look.sample, machines=look.machines)
    counted = walk.candidates
    expiry = _expiries(counted, params, kubelets)
    said = _witnessed(counted, expiry, now, params, kubelets)
    stale = _stale(counted, expiry, now, witnessed=kubelets is not None) - said.alive
    # What a scale-down may count: those a read sent now finds silent to both witnesses (the
    # interlocks' read is sent after this verdict; their confirming verdict judges by its time).
    silent = said.silent_by(stale, kubelets.read_at if look.confirming and kubelets is not None else now)
    sampled = look.sample is not None and len(look.sample) < len(look.nodes)

    def fraction_of(of: frozenset[str]) -> tuple[dict[str, tuple[int, int]], float | None]:
        zones = per_zone(look.nodes, counted, of)
        return zones, stratified(zones, walk.zones) if sampled else None

    (zones, estimate), (_, silent_estimate) = fraction_of(stale), fraction_of(silent)
    quorum = Quorum(len(counted), len(stale), estimate, fraction(len(silent), len(counted), silent_estimate))
    verdict = judge(look.memory, now, params, quorum, view_since=look.view_since, records=look.records)
    verdict = _explained(
        verdict, counted, zones=zones, estimate=estimate, said=said, stale=stale, left_out=walk.left_out
    )
    next_look = _next_look(verdict, expiry, stale | said.alive, now, params)
    if next_look is not None and (verdict.wake_at is None or next_look < verdict.wake_at):
        verdict = replace(verdict, wake_at=next_look)
    return verdict


def _expiries(
    counted: Mapping[str, LeaseObs], params: DeciderSettings, kubelets: Readings | None
) -> dict[str, float]:
    """When each candidate turns stale if not renewed again."""
    answered = answerable(counted, kubelets)
    return {n: stale_at(lease, params, answered=n in answered) for n, lease in counted.items()}


def _stale(
    counted: Mapping[str, LeaseObs], expiry: Mapping[str, float], now: float, *, witnessed: bool
) -> frozenset[str]:
    """The stale candidates as their agents' leases say. A released one only with a second
    witness to ask (it is silent to its kubelet too, or nothing counts it)."""
    return frozenset(
        n for n, lease in counted.items() if now >= expiry[n] and (witnessed or not lease.view.released)
    )


def _next_look(
    verdict: Verdict,
    expiry: Mapping[str, float],
    not_fresh: frozenset[str],
    now: float,
    params: DeciderSettings,
) -> float | None:
    """When the next look can change the verdict, where that falls before the next tick: the
    moment the failure fraction is reached if no fresh candidate renews again (healthy), the
    end of the confirm period (confirming). Looked at a whole tick later, a cut would wait up to
    that tick for its verdict; a look that changes nothing costs one tick's work."""
    memory = verdict.memory
    if memory.phase is Phase.CONFIRMING and not verdict.scale_down:
        end = memory.since + params.confirm_period_s
        return end if now < end < now + params.tick_s else None
    if memory.phase is not Phase.HEALTHY or not verdict.judged:
        return None
    # Counted plainly, also for a sample (the estimate weighs zones): only a look rides on it.
    need = _stale_at_failure(verdict.candidates, params.failure_fraction) - verdict.stale
    if need <= 0:
        return None
    soon = sorted(at for name, at in expiry.items() if name not in not_fresh and at < now + params.tick_s)
    return soon[need - 1] if len(soon) >= need else None


def _stale_at_failure(candidates: int, failure_fraction: float) -> int:
    """The fewest stale of ``candidates`` that reach the failure fraction (``candidates + 1``:
    none do). Searched from just below the product, as float rounding can put it either side."""
    first = math.floor(failure_fraction * candidates)
    return next(
        (
            stale
            for stale in range(first, candidates + 1)
            if stale_fraction(stale, candidates) >= failure_fraction
        ),
        candidates + 1,
    )


# A released node's kubelet is its only witness, where a stale one's agreed with its agent: it
# is given twice the slack, so that a kubelet whose writes land up to 1.5 s after their stamps
# (a loaded node or API server, during a roll) is not called silent between two renewals.
RELEASED_SLACK_FACTOR = 2.0


def _witnessed(
    counted: Mapping[str, LeaseObs],
    expiry: Mapping[str, float],
    now: float,
    params: DeciderSettings,
    kubelets: Readings | None,
) -> Witness:
    """What the kubelets say of the candidates whose agents are stale (released or not). A
    released node whose kubelet was alive is alive only until its kubelet's next renewal is
    due: from then on it counts as silent until a read shows that renewal, as a pending node
    does (the interlocks' fresh read decides before any scale-down), and the verdict looks
    again at that moment rather than at the next regular read, up to 10 s later."""
    said = []
    for released, slack_s in (
        (False, params.witness_slack_s),
        (True, params.witness_slack_s * RELEASED_SLACK_FACTOR),
    ):
        stale = {
            n: (micro_time(lease.view.renew_time), lease.seen_renewed_mono)
            for n, lease in counted.items()
            if now >= expiry[n] and lease.view.released is released
        }
        said.append(
            witness(
                stale,
                kubelets,
                margin_s=params.witness_margin_s,
                slack_s=slack_s,
                bracket_s=params.witness_bracket_s,
            )
        )
    plain, rolled = said
    overdue = {n for n, due in rolled.alive_due.items() if due <= now}
    return Witness(
        plain.alive | (rolled.alive - overdue),
        {**plain.pending, **rolled.pending},
        {n: due for n, due in rolled.alive_due.items() if n not in overdue},
    )


def _explained(
    verdict: Verdict,
    counted: Mapping[str, LeaseObs],
    *,
    zones: Mapping[str, tuple[int, int]],
    estimate: float | None,
    said: Witness,
    stale: frozenset[str],
    left_out: Mapping[str, str],
) -> Verdict:
    """The verdict with what it rests on: the zones, the estimate (for a judged quorum only: a
    blind or too-thin tick has none), the silent agents whose kubelets renew (an agent that
    released is not failing: a roll is not told as one), the nodes left out."""
    reason = verdict.reason
    alive = said.alive - {n for n, lease in counted.items() if lease.view.released}
    if alive and verdict.judged:
        reason += (
            f"; {len(alive)} agent(s) silent while their kubelets renew: the path works, the agents fail"
        )
    return replace(
        verdict,
        zones=zones,
        estimate=estimate if verdict.judged else None,
        path_alive=alive,
        pending=len(stale & said.pending.keys()),
        wake_at=min(
            [*(due for n, due in said.pending.items() if n in stale), *said.alive_due.values()], default=None
        ),
        reason=reason,
        left_out=left_out,
    )
