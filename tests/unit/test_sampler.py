"""testenv/worlds/shoot_world.py's Sampler: a check of "nothing bad happened" over a window fails when the
samples do not cover the window, instead of passing on what nobody saw."""

from __future__ import annotations

import time
from typing import Any

import pytest

from testenv.base.kapi import Client
from testenv.worlds.shoot_world import MAX_GAP_S, Sample, Sampler


class Failing(Client):
    """A seed that never answers: every step fails, as a broken sampler's would. A Client to
    the sampler with no connection behind it (Client's own ``__init__`` is not called)."""

    def __init__(self) -> None:
        pass

    def get(self, path: str, **params: str) -> dict[str, Any]:
        raise OSError("connection refused")

    def close(self) -> None:
        pass


def sampler_with(times: list[float]) -> Sampler:
    s = Sampler(Failing(), "ns")
    s.samples = [Sample(t, {"kcm": 3}, {}, {}) for t in times]
    return s


def test_a_sampler_that_saw_nothing_fails_the_check_it_was_asked() -> None:
    s = Sampler(Failing(), "ns")
    for _ in range(3):
        with pytest.raises(OSError):
            s.step()
    with pytest.raises(AssertionError, match="took no sample"):
        s.first(lambda sample: sample.replicas["kcm"] == 0)
    with pytest.raises(AssertionError, match="took no sample"):
        s.between(0.0)


def test_a_sample_that_failed_in_the_window_fails_the_check() -> None:
    """One failed read is a moment nobody looked at: a check over it fails, saying why."""
    now = time.monotonic()
    s = sampler_with([now - 2 + 0.1 * i for i in range(21)])
    s.client = Failing()
    with pytest.raises(OSError):
        s.step()
    with pytest.raises(
        AssertionError, match="failed 1 times in the window, first: OSError: connection refused"
    ):
        s.first(lambda sample: False, after=now - 2)
    assert len(s.between(now - 2, now - 1)) == 11  # a window before the failure still answers


def test_a_gap_in_the_window_fails_it_and_a_covered_one_answers() -> None:
    now = time.monotonic()
    covered = sampler_with([now - 3 + 0.1 * i for i in range(31)])
    assert covered.first(lambda sample: sample.replicas["kcm"] == 0, after=now - 3) is None
    assert len(covered.between(now - 2, now)) == 21
    gap = sampler_with([now - 6, now - 5.9, now - 1.0, now - 0.9])  # 4.9 s unseen in between
    with pytest.raises(AssertionError, match=r"saw nothing for 4\.9s"):
        gap.first(lambda sample: False, after=now - 6)
    stopped = sampler_with([now - 10 + 0.1 * i for i in range(20)])  # nothing for the last 8 s
    with pytest.raises(AssertionError, match="saw nothing for"):
        stopped.between(now - 10)
    assert MAX_GAP_S < 4.9
