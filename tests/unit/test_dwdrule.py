"""The model of dependency-watchdog's rule that bench/race.py sets beside the measured race."""

from __future__ import annotations

import math
import random

from bench.dwdrule import Rule, expired_at, over_phases, scale_down_at

RULE = Rule()


def test_a_lease_counts_expired_three_quarters_of_the_grace_after_its_renewal() -> None:
    assert expired_at(-4.0, RULE) == 26.0


def test_the_probe_that_acts_is_the_first_to_see_the_quorum_expired() -> None:
    # Ten leases renewed 0..9 s before the cut expire 21..30 s after it; 60 % of ten is the
    # sixth, expired at 26 s (renewed 4 s before the cut).
    renewed = [-float(i) for i in range(10)]
    no_jitter = Rule(jitter=0.0)
    assert scale_down_at(renewed, 26.0, no_jitter, random.Random(0)) == 26.0
    assert scale_down_at(renewed, 25.9, no_jitter, random.Random(0)) == 55.9  # just missed: a period later
    assert scale_down_at(renewed, 10.0, no_jitter, random.Random(0)) == 40.0


def test_the_jitter_only_stretches_the_period() -> None:
    renewed = [-float(i) for i in range(10)]
    times = [scale_down_at(renewed, 1.0, RULE, random.Random(seed)) for seed in range(200)]
    assert all(31.0 <= t <= 37.0 for t in times)  # the second probe: 30 s and up to a fifth more
    assert max(times) - min(times) > 4.0


def test_one_candidate_never_scales() -> None:
    assert scale_down_at([-1.0], 0.0, RULE, random.Random(0)) == math.inf


def test_over_the_phases_kcm_follows_a_second_later_somewhere_within_a_period_of_the_quorum() -> None:
    renewed = [-float(i) for i in range(10)]
    out = over_phases(renewed, draws=2000, seed=1)
    # The quorum expires at 26 s: the acting probe lies in [26, 26 + 36) s, KCM 1.1 s after it.
    assert 27.1 <= out.low < 28.0
    assert out.high < 26 + 36 + 1.1
    assert 35 < out.median < 55
    assert over_phases(renewed, draws=50, seed=1) == over_phases(renewed, draws=50, seed=1)  # seeded
