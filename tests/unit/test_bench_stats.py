"""bench/tools/stats.py: min / median / max of measured values and the exact distribution of the
aggregator's sampled estimate, on inputs small enough to count by hand."""

from __future__ import annotations

import math

import pytest

from bench.tools.stats import (
    estimate,
    hypergeom_pmf,
    log_comb,
    min_median_max,
    p_down_spread,
    p_down_zoned,
    percentile,
)


def test_min_median_max() -> None:
    assert min_median_max([]) == "-"
    assert min_median_max([2.25]) == "2.2 / 2.2 / 2.2 s"  # round half to even, as format does
    assert min_median_max([3.0, 1.0, 10.04, 2.0]) == "1.0 / 2.5 / 10.0 s"
    assert min_median_max(iter([5.0, 4.0, 6.0]), "ms") == "4.0 / 5.0 / 6.0 ms"
    assert min_median_max([0.0004, 2.0, 1.5], "s", 3) == "0.000 / 1.500 / 2.000 s"
    assert min_median_max([3.0, 1.0, 2.0], "", 0) == "1 / 2 / 3"  # a count: no unit, no trailing space


def test_percentile_is_the_nearest_rank() -> None:
    assert math.isnan(percentile([], 0.5))
    assert percentile([5.0], 0.99) == 5.0
    xs = [float(x) for x in range(100, 0, -1)]  # 1..100, unsorted
    assert percentile(xs, 0.5) == 50.0
    assert percentile(xs, 0.99) == 99.0
    assert percentile(xs, 0.991) == 100.0
    assert percentile(xs, 0.0) == 1.0


ZONES = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "b3": "b", "b4": "b"}


def test_estimate_weighs_each_zones_stale_share_by_its_size() -> None:
    # a: 1 of 1 member stale, weight 2/6; b: 1 of 2, weight 4/6.
    assert estimate(["a1", "b1"], {"a1", "b1", "b2"}, ZONES) == pytest.approx(2 / 3)
    assert estimate([], {"a1", "b1", "b2"}, ZONES) == 0.0
    assert estimate(ZONES, {"a1", "b1", "b2"}, ZONES) == pytest.approx(1.0)
    # Nodes outside the sample do not count.
    assert estimate(["a2", "b3", "b4"], {"a1", "b1", "b2"}, ZONES) == 0.0


def test_estimate_covers_only_the_zones_with_members() -> None:
    assert estimate(["b1", "a1"], {"b1", "b2"}, ZONES) == 0.5
    assert estimate(["a1"], set(), ZONES) == 0.0


def test_log_comb() -> None:
    assert math.exp(log_comb(5, 2)) == pytest.approx(10)
    assert log_comb(4, 0) == 0.0
    assert log_comb(4, 4) == 0.0
    assert log_comb(3, 4) == -math.inf
    assert log_comb(3, -1) == -math.inf


def test_hypergeom_pmf_counts_by_hand() -> None:
    # 5 nodes, 2 stale, a sample of 2: C(3,2), C(2,1)C(3,1), C(2,2) of C(5,2) = 10.
    assert hypergeom_pmf(5, 2, 2) == pytest.approx([0.3, 0.6, 0.1])
    assert hypergeom_pmf(3, 0, 2) == pytest.approx([1.0, 0.0, 0.0])
    assert hypergeom_pmf(3, 3, 2) == pytest.approx([0.0, 0.0, 1.0])
    assert hypergeom_pmf(4, 1, 0) == pytest.approx([1.0])
    assert sum(hypergeom_pmf(100, 37, 20)) == pytest.approx(1.0)


def test_p_down_spread_two_zones_of_two() -> None:
    # One member per zone, 2 of the 4 nodes silenced: neither member stale 1/6, one of them
    # 4/6 (estimate 0.5), both 1/6 (estimate 1).
    down, up = p_down_spread([2, 2], [1, 1], 2, threshold=0.5)
    assert (down, up) == pytest.approx((5 / 6, 1 / 6))
    down, up = p_down_spread([2, 2], [1, 1], 2, threshold=0.6)
    assert (down, up) == pytest.approx((1 / 6, 5 / 6))
    down, up = p_down_spread([2, 2], [1, 1], 0, threshold=0.5)
    assert down == 0.0 and up == pytest.approx(1.0)
    down, up = p_down_spread([2, 2], [1, 1], 4, threshold=0.5)
    assert down == pytest.approx(1.0) and up == 0.0


def test_p_down_zoned_one_cut_per_zone() -> None:
    # Zone 0 wholly silent: its member is stale, the estimate is 0.5 for certain.
    down, up = p_down_zoned([2, 2], [1, 1], [2, 0], threshold=0.5)
    assert down == pytest.approx(1.0) and up == 0.0
    down, up = p_down_zoned([2, 2], [1, 1], [2, 0], threshold=0.6)
    assert down == 0.0 and up == pytest.approx(1.0)
    # Half of each zone: each member stale with 1/2, independently.
    assert p_down_zoned([2, 2], [1, 1], [1, 1], threshold=0.5) == pytest.approx((0.75, 0.25))
    assert p_down_zoned([2, 2], [1, 1], [1, 1], threshold=1.0) == pytest.approx((0.25, 0.75))


def test_spread_and_zoned_agree_where_a_spread_cut_is_one_zone_shape() -> None:
    # With a single zone both are the plain hypergeometric tail.
    down, up = p_down_spread([10], [4], 5, threshold=0.5)
    pmf = hypergeom_pmf(10, 5, 4)
    assert (down, up) == pytest.approx((sum(pmf[2:]), sum(pmf[:2])))
    assert p_down_zoned([10], [4], [5], threshold=0.5) == pytest.approx((down, up))
