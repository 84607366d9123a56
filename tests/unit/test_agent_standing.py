"""Where the renewer stands (agent/renewer.py ``Standing``), its transitions pure, as a table:
the standing before, what a renewal answered, the standing after."""

from __future__ import annotations

from datetime import UTC, datetime

from agent.renewer import Standing, State
from core.lease import LeaseView, Outage

OUTAGE = Outage(start=datetime(2026, 12, 8, tzinfo=UTC), duration_s=12.5, failure_class="connect")


def lease(*, previous: str | None = None, annotated: bool = True) -> LeaseView:
    return LeaseView(
        "n1", renew_time="2026-12-08T00:00:13.000000Z", annotated=annotated, previous_renew=previous
    )


def test_the_first_renewal_clears_a_release_a_previous_run_left() -> None:
    after = Standing().renewed(lease(), None)
    assert (after.state, after.clear_released, after.evidence_possible) == (State.RENEWING, False, True)
    assert after.entered(Standing())


def test_a_recovery_proven_by_evidence_is_written_with_the_next_plain_renewal() -> None:
    failing = Standing(state=State.RENEWING).failed("connect")
    assert (failing.state, failing.failure_class) == (State.FAILING, "connect")
    proven = failing.renewed(lease(previous="2026-12-08T00:00:05.000000Z"), OUTAGE)
    assert (proven.unwritten, proven.previous_left, proven.failure_class) == (OUTAGE, True, "")
    plain = failing.renewed(lease(), OUTAGE)  # no evidence left to clear: nothing to write later
    assert plain.unwritten is None


def test_a_renewal_while_renewing_keeps_what_is_still_to_be_written() -> None:
    before = Standing(state=State.RENEWING, unwritten=OUTAGE)
    assert before.renewed(lease(), None).unwritten == OUTAGE
    assert not before.renewed(lease(), None).entered(before)


def test_misses_count_404s_until_a_renewal_and_a_new_class_of_failure_is_a_new_state() -> None:
    waiting = Standing().missing().missing()
    assert (waiting.state, waiting.misses) == (State.WAITING, 2)
    assert waiting.renewed(lease(), None).misses == 0
    tls = waiting.failed("tls")
    assert tls.entered(waiting) and tls.failed("connect").entered(tls) and not tls.failed("tls").entered(tls)
    assert waiting.renewed(lease(annotated=False), None).evidence_possible is False
