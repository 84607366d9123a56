"""The stale fraction a verdict judges: plain over every candidate, or estimated from the fast
sample zone by zone (``stratified``), since the sample is drawn per zone and not in proportion.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from aggregator.model.observed import LeaseObs, NodeObs
from aggregator.model.verdict import stale_fraction


def stratified(zones: Mapping[str, tuple[int, int]], size: Mapping[str, int]) -> float | None:
    """The stale fraction of the whole cluster, estimated from a sample drawn per zone
    (``zones``: its candidates and stale ones per zone): each zone's stale fraction weighted
    by the zone's share of the nodes the verdict stands for (not of all its nodes: a zone of
    280 nodes, 279 of them ignored, must weigh as one node, not as 70 % of the cluster). The
    sample gives a small zone more than its share (aggregator/act/budget.py), so counting it
    plainly would overweight it; weighting by zone keeps the estimate unbiased. Zones
    without a candidate drop out and the others are weighted among themselves. None when
    nothing is counted. ``size``: each zone's nodes the verdict stands for
    (aggregator/model/eligibility.py ``Eligibility.zones``)."""
    covered = sum(size.get(z, 0) for z in zones)
    if not covered:
        return None
    return sum(size.get(z, 0) / covered * st / c for z, (c, st) in zones.items())


def per_zone(
    nodes: Mapping[str, NodeObs], counted: Mapping[str, LeaseObs], stale: Collection[str]
) -> dict[str, tuple[int, int]]:
    """Candidates and stale ones per zone."""
    out: dict[str, tuple[int, int]] = {}
    for name in counted:
        zone = nodes[name].view.zone
        n, s = out.get(zone, (0, 0))
        out[zone] = (n + 1, s + (name in stale))
    return out


def fraction(s: int, n: int, estimate: float | None) -> float:
    """The fraction judged: the estimate where the candidates are a sample, else ``s / n``."""
    return stale_fraction(s, n) if estimate is None else estimate
