"""The phase machine: where a target's phase goes on one tick's quorum, and why.

The phase alone says what the dependents should be (``Verdict.desired``); an actuator
converges the seed towards that, so the phase never waits for, nor depends on, a scale
having worked.

Phases (see docs/decision.md):
  starting    -> healthy | scaled-down (held)   from our record in the annotations, once read
  healthy     -> confirming   stale/candidates >= failure fraction
  confirming  -> scaled-down  still there after the confirm period (the interlocks must agree)
  confirming  -> healthy      below it again, no verdict, or the view is not trusted
  scaled-down -> recovering   below the recovery fraction, or no verdict is possible
  recovering  -> scaled-down  at the recovery fraction again
  recovering  -> healthy      after the recovery period
  scaled-down -> healthy      nothing could be seen for the blind limit

"Held": a start (a restart, a takeover) that finds records of ours resumes scaled
down, but lowers nothing and raises nothing (``Desired.HOLD``) until a fresh verdict:
the quorum lost for the confirm period (then scaled-down, through the interlocks) or
recovered for the recovery period (then healthy). A start never lowers a controller
that is up: it may be in the middle of a scale-up.

"No verdict" (fewer than min candidates) never holds the controllers at 0: it
counts towards recovery. A view the aggregator cannot trust (its watches are
not current, KAPI did not answer, its own process stalled) is not staleness of
the leases: nothing is judged until the view has been fresh for a whole lease
duration, exactly as after a start.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aggregator.decide.estimate import fraction
from aggregator.model.settings import DeciderSettings
from aggregator.model.verdict import Memory, Phase, Verdict


@dataclass(frozen=True)
class Quorum:
    """``stale`` of ``candidates`` (``estimate``: the stratified estimate of the fraction when
    they are a sample), and the fraction silent to both witnesses (what a scale-down counts)."""

    candidates: int
    stale: int
    estimate: float | None
    silent: float

    @property
    def fraction(self) -> float:
        return fraction(self.stale, self.candidates, self.estimate)


def judge(
    memory: Memory,
    now: float,
    params: DeciderSettings,
    q: Quorum,
    *,
    view_since: float | None,
    records: bool | None,
) -> Verdict:
    """One tick's verdict on quorum ``q``: starting until the record is read, not judging until
    the view is trusted, no verdict on too few candidates, else the phase machine (``_quorum``)."""
    candidates, stale = q.candidates, q.stale
    if memory.phase is Phase.STARTING:
        # The record is the state a start continues from; the view rule below still
        # keeps any verdict back until the view has been fresh for a lease duration.
        if records is None:
            return _to(
                memory,
                now,
                Phase.STARTING,
                "starting: reading the scale-down record",
                candidates=candidates,
                stale=stale,
            )
        memory = Memory(Phase.DOWN, now, held=True) if records else Memory(Phase.HEALTHY, now)
    view_ready = view_since is not None and now - view_since >= params.lease_duration_s
    if not view_ready:
        why = (
            "the view of the shoot is not current"
            if view_since is None
            else f"view fresh for {now - view_since:.1f}s, judging after {params.lease_duration_s:g}s"
        )
        return replace(_blind(memory, now, params, why), candidates=candidates, stale=stale)
    if candidates < params.min_candidates:
        why = f"no verdict: {candidates} candidate(s), fewer than {params.min_candidates}"
        if _running(memory):
            return _to(memory, now, Phase.HEALTHY, why, candidates=candidates, stale=stale)
        # Holding the controllers at 0 on no evidence is never the default.
        return _recover(memory, now, params, why, candidates=candidates, stale=stale, judged=False)
    return _quorum(memory, now, params, q)


def _running(memory: Memory) -> bool:
    """Healthy, or confirming from healthy: the dependents run (a held start's confirming does not)."""
    return memory.phase is Phase.HEALTHY or (memory.phase is Phase.CONFIRMING and not memory.held)


def _to(
    memory: Memory,
    now: float,
    phase: Phase,
    reason: str,
    *,
    candidates: int,
    stale: int,
    judged: bool = False,
) -> Verdict:
    """A verdict for ``phase``, which keeps its ``since`` while the phase holds (and a held start
    stays held until it is healthy)."""
    since = memory.since if phase is memory.phase else now
    held = memory.held and phase is not Phase.HEALTHY
    return Verdict(Memory(phase, since, held=held), candidates, stale, reason, judged=judged)


def _quorum(memory: Memory, now: float, params: DeciderSettings, q: Quorum) -> Verdict:
    """The phase machine on a judged quorum ``q``."""
    candidates, stale, fraction = q.candidates, q.stale, q.fraction
    estimated = "" if q.estimate is None else " of the nodes, estimated"
    ratio = f"{stale}/{candidates} stale ({fraction:.0%}{estimated})"
    at_failure = fraction >= params.failure_fraction
    phase = memory.phase
    if memory.held:
        return _held(
            memory,
            now,
            params,
            ratio,
            q,
            at_failure=at_failure,
            recovered=fraction < params.recovery_fraction,
        )
    if phase is Phase.HEALTHY:
        if at_failure:
            why = f"{ratio} >= {params.failure_fraction:.0%}: confirming"
            return _to(memory, now, Phase.CONFIRMING, why, candidates=candidates, stale=stale, judged=True)
        return _to(memory, now, Phase.HEALTHY, ratio, candidates=candidates, stale=stale, judged=True)
    if phase is Phase.CONFIRMING:
        if not at_failure:
            why = f"{ratio}: below the failure fraction again"
            return _to(memory, now, Phase.HEALTHY, why, candidates=candidates, stale=stale, judged=True)
        return _confirm(memory, now, params, ratio, q)
    if fraction < params.recovery_fraction:
        return _recover(
            memory,
            now,
            params,
            f"{ratio} < {params.recovery_fraction:.0%}",
            candidates=candidates,
            stale=stale,
            judged=True,
        )
    return _to(memory, now, Phase.DOWN, ratio, candidates=candidates, stale=stale, judged=True)


def _confirm(memory: Memory, now: float, params: DeciderSettings, ratio: str, q: Quorum) -> Verdict:
    """Confirming at the failure fraction: the scale-down once the confirm period has passed and
    enough of the stale are silent to both witnesses (a kubelet whose next renewal is not due
    yet could still prove the path); until then, confirming on (from the same moment)."""
    if now - memory.since < params.confirm_period_s:
        return _to(
            memory,
            now,
            Phase.CONFIRMING,
            f"{ratio}: confirming",
            candidates=q.candidates,
            stale=q.stale,
            judged=True,
        )
    if q.silent < params.failure_fraction:
        why = f"{ratio}: confirmed, waiting for the kubelets' next renewals ({q.silent:.0%} silent to both)"
        return _to(memory, now, Phase.CONFIRMING, why, candidates=q.candidates, stale=q.stale, judged=True)
    why = f"{ratio} for {now - memory.since:.1f}s: quorum lost"
    return Verdict(Memory(Phase.DOWN, now), q.candidates, q.stale, why, judged=True, scale_down=True)


def _held(
    memory: Memory,
    now: float,
    params: DeciderSettings,
    ratio: str,
    q: Quorum,
    *,
    at_failure: bool,
    recovered: bool,
) -> Verdict:
    """A start that found records of ours: the quorum lost for the confirm period scales down
    (through the interlocks); recovered for the recovery period, the scale-up is finished."""
    candidates, stale = q.candidates, q.stale
    if at_failure:
        if memory.phase is not Phase.CONFIRMING:
            why = f"{ratio} >= {params.failure_fraction:.0%}: confirming (holding what a start found)"
            return _to(memory, now, Phase.CONFIRMING, why, candidates=candidates, stale=stale, judged=True)
        return _confirm(memory, now, params, f"{ratio} (holding)", q)
    if recovered:
        return _recover(
            memory,
            now,
            params,
            f"{ratio} < {params.recovery_fraction:.0%}",
            candidates=candidates,
            stale=stale,
            judged=True,
        )
    return _to(
        memory,
        now,
        Phase.DOWN,
        f"{ratio}: holding what a start found",
        candidates=candidates,
        stale=stale,
        judged=True,
    )


def _blind(memory: Memory, now: float, params: DeciderSettings, why: str) -> Verdict:
    """Nothing can be judged: confirmation starts again; scaled down (or held) stays so, for a while."""
    phase = memory.phase
    if _running(memory):
        mem = memory if phase is Phase.HEALTHY else Memory(Phase.HEALTHY, now)
        return Verdict(mem, 0, 0, f"not judging: {why}")
    blind_since = now if memory.blind_since is None else memory.blind_since
    if now - blind_since >= params.blind_limit_s:
        return Verdict(
            Memory(Phase.HEALTHY, now),
            0,
            0,
            f"nothing seen for {now - blind_since:.0f}s while scaled down ({why}): restoring",
        )
    mem = memory if phase is Phase.DOWN else Memory(Phase.DOWN, now, held=memory.held)
    return Verdict(replace(mem, blind_since=blind_since), 0, 0, f"holding: {why}")


def _recover(
    memory: Memory,
    now: float,
    params: DeciderSettings,
    why: str,
    *,
    candidates: int,
    stale: int,
    judged: bool,
) -> Verdict:
    if memory.phase is Phase.RECOVERING and now - memory.since >= params.recovery_period_s:
        why = f"{why} for {now - memory.since:.1f}s: recovered"
        return _to(memory, now, Phase.HEALTHY, why, candidates=candidates, stale=stale, judged=judged)
    return _to(
        memory, now, Phase.RECOVERING, f"{why}: recovering", candidates=candidates, stale=stale, judged=judged
    )


def blocked(verdict: Verdict, before: Memory, now: float, why: str) -> Verdict:
    """An interlock refused the scale-down: confirmation starts again from ``now`` (held, when
    the memory ``before`` this tick was: a refusal is no verdict to raise anything on)."""
    memory = Memory(Phase.CONFIRMING, now, held=before.held)
    return replace(verdict, memory=memory, reason=f"scale-down blocked: {why}", scale_down=False)


def deferred(verdict: Verdict, before: Memory) -> Verdict:
    """The interlocks could not check (our own overload): nothing happens this tick, and the
    phase stays as it was, confirmation kept, so the next tick checks again."""
    return replace(verdict, memory=before, reason=f"{verdict.reason}; checking again", scale_down=False)


def take_over(now: float) -> Memory:
    """A standby becomes leader: like a start, it resumes from the record in the annotations
    (its view is already warm, so it judges as soon as that has been read)."""
    return Memory(Phase.STARTING, now)
