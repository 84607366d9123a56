"""Exact statistics for the benches: min / median / max of measured values, and the
aggregator's sampled estimate of the stale fraction with its exact distribution
(hypergeometric, per zone)."""

from __future__ import annotations

import collections
import itertools
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence


def min_median_max(xs: Iterable[float], unit: str = "s", digits: int = 1) -> str:
    """ "min / median / max unit", to ``digits`` decimals; "-" for no values."""
    ordered = sorted(xs)
    if not ordered:
        return "-"
    low, mid, high = (f"{x:.{digits}f}" for x in (ordered[0], statistics.median(ordered), ordered[-1]))
    return f"{low} / {mid} / {high} {unit}".rstrip()


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of them at or below it; nan for none."""
    ordered = sorted(xs)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def estimate(cut: Iterable[str], sample: Collection[str], zones: Mapping[str, str]) -> float:
    """The stale fraction the aggregator reports while ``cut`` is silent, computed here on its
    own: each zone's stale share of its ``sample`` members, weighted by the zone's size."""
    silent = set(cut)
    size = collections.Counter(zones.values())
    members = collections.Counter(zones[x] for x in sample)
    stale = collections.Counter(zones[x] for x in sample if x in silent)
    covered = sum(size[z] for z in members)
    return sum(size[z] / covered * stale[z] / members[z] for z in members) if covered else 0.0


def log_comb(n: int, k: int) -> float:
    """log(n choose k); -inf where k is out of 0..n."""
    if k < 0 or k > n:
        return -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def hypergeom_pmf(population: int, stale: int, sample: int) -> list[float]:
    """P(X = x) for x stale members in a sample drawn without replacement, x = 0..sample."""
    denom = log_comb(population, sample)
    return [
        math.exp(log_comb(stale, x) + log_comb(population - stale, sample - x) - denom)
        for x in range(sample + 1)
    ]


def _down(weights: Sequence[float], members: Sequence[int], stale: Sequence[int], threshold: float) -> bool:
    return sum(w * x / k for w, x, k in zip(weights, stale, members, strict=True)) >= threshold


def p_down_spread(
    size: Sequence[int], members: Sequence[int], cut: int, threshold: float
) -> tuple[float, float]:
    """Exact P(scale-down verdict: estimate >= ``threshold``) for ``cut`` nodes silenced at
    random over the cluster: the stale members of each zone's slice of the sample are jointly
    multivariate hypergeometric (the slices, and everything outside the sample, are the
    categories). With P(no scale-down), summed on its own so that a tail near 1 keeps its
    complement."""
    n, k = sum(size), sum(members)
    weights = [z / n for z in size]
    denom = log_comb(n, cut)
    total = [0.0, 0.0]
    for stale in itertools.product(*(range(m + 1) for m in members)):
        log_p = sum(log_comb(m, x) for m, x in zip(members, stale, strict=True))
        p = math.exp(log_p + log_comb(n - k, cut - sum(stale)) - denom)
        total[_down(weights, members, stale, threshold)] += p
    return total[1], total[0]


def p_down_zoned(
    size: Sequence[int], members: Sequence[int], cut: Sequence[int], threshold: float
) -> tuple[float, float]:
    """Exact P(scale-down verdict) for ``cut[z]`` nodes silenced at random within each zone:
    independent hypergeometrics, one per zone. With P(no scale-down), as above."""
    n = sum(size)
    weights = [z / n for z in size]
    pmfs = [hypergeom_pmf(z, c, m) for z, c, m in zip(size, cut, members, strict=True)]
    total = [0.0, 0.0]
    for stale in itertools.product(*(range(m + 1) for m in members)):
        p = math.prod(pmf[x] for pmf, x in zip(pmfs, stale, strict=True))
        total[_down(weights, members, stale, threshold)] += p
    return total[1], total[0]
