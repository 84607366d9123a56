from __future__ import annotations

import collections
import itertools

import pytest

from aggregator.act.budget import (
    MIN_PER_ZONE,
    MIN_SAMPLE,
    ROTATION_S,
    SLOW_INTERVALS_S,
    allocate,
    hand_over,
    plan,
)


def nodes(n: int) -> list[str]:
    return [f"shoot-worker-{i:05d}" for i in range(n)]


def test_small_cluster_renews_fast_everywhere() -> None:
    p = plan(nodes(200), fast_interval_s=2.0, budget_per_s=100)
    assert len(p.fast) == 200
    assert p.slow_interval_s == 2.0
    assert p.writes_per_s(200) == pytest.approx(100)


@pytest.mark.parametrize("n", [201, 1000, 5000, 20000])
def test_large_clusters_stay_within_the_budget_with_a_fast_sample(n: int) -> None:
    p = plan(nodes(n), fast_interval_s=2.0, budget_per_s=100)
    assert p.writes_per_s(n) <= 100 + 1e-9
    assert len(p.fast) >= MIN_SAMPLE
    assert p.fast_interval_s == 2.0  # detection time does not grow with the cluster
    assert p.slow_interval_s >= 60.0


def test_5000_nodes() -> None:
    # 4882 slow nodes every 2 minutes are 40.7 writes/s; 118 fast ones every 2 s take the rest.
    p = plan(nodes(5000), fast_interval_s=2.0, budget_per_s=100)
    assert (len(p.fast), p.slow_interval_s) == (118, 120.0)


@pytest.mark.parametrize("n", [300, 1000, 3000, 5000, 20000])
def test_slow_intervals_take_a_few_fixed_values(n: int) -> None:
    assert plan(nodes(n), 2.0, 100).slow_interval_s in SLOW_INTERVALS_S


def test_sample_is_stable_and_moves_little() -> None:
    a = plan(nodes(5000), 2.0, 100)
    assert a == plan(list(reversed(nodes(5000))), 2.0, 100)
    b = plan([*nodes(5000), "new-node"], 2.0, 100)
    assert len(a.fast ^ b.fast) <= 2


def test_a_tiny_budget_still_keeps_a_useful_sample() -> None:
    p = plan(nodes(1000), fast_interval_s=2.0, budget_per_s=5)
    assert len(p.fast) == MIN_SAMPLE
    assert p.slow_interval_s == 300.0  # the longest interval an agent accepts
    assert p.writes_per_s(1000) > 5  # a useful sample wins over the budget; the target warns


def test_one_node_more_plans_a_few_lease_updates_not_thousands() -> None:
    from aggregator.act.budget import Pacing
    from aggregator.act.provisioner import Provisioner
    from aggregator.model.objects import NodeView
    from aggregator.model.observed import LeaseObs, NodeObs
    from aggregator.model.settings import ProvisionSettings
    from aggregator.observe.watcher import Observed
    from core.lease import LeaseView

    observed = Observed()
    pacing: list[Pacing] = []
    provisioner = Provisioner(
        None,  # type: ignore[arg-type]  # plan() does no I/O
        observed,
        ProvisionSettings(),
        lease_duration_s=8.0,
    )
    names = nodes(5000)
    observed.nodes = {n: NodeObs(NodeView(n, uid=f"uid-{n}"), 0.0) for n in names}
    pacing.append(plan(names, 2.0, 100))
    for n in names:  # every lease as the provisioner wants it
        want = provisioner.desired(n, pacing[-1])
        view = LeaseView(n, interval=want.interval, duration_s=want.duration_s, owner_uids=(f"uid-{n}",))
        observed.own[n] = LeaseObs(view, 0.0)
    assert provisioner.plan(pacing[-1]) == ([], [], [])
    observed.nodes["node-new"] = NodeObs(NodeView("node-new", uid="uid-node-new"), 0.0)
    pacing.append(plan([*names, "node-new"], 2.0, 100))
    create, update, delete = provisioner.plan(pacing[-1])
    assert (create, delete) == (["node-new"], [])
    assert len(update) <= 3, update


def zoned(sizes: dict[str, int]) -> dict[str, str]:
    return {f"{zone}-worker-{i:05d}": zone for zone, n in sizes.items() for i in range(n)}


def test_the_sample_is_drawn_per_zone_with_a_minimum_each() -> None:
    """Zones of 3000, 1500 and 500 nodes: each has at least MIN_PER_ZONE in the sample, the rest
    goes by size, and the sample keeps its size (the budget holds)."""
    zones = zoned({"zone-a": 3000, "zone-b": 1500, "zone-c": 500})
    p = plan(zones, 2.0, 100, zones)
    assert len(p.fast) == len(plan(list(zones), 2.0, 100).fast) == 118
    per_zone = collections.Counter(zones[n] for n in p.fast)
    assert min(per_zone.values()) >= MIN_PER_ZONE
    assert per_zone["zone-a"] > per_zone["zone-b"] > per_zone["zone-c"]
    assert p.writes_per_s(len(zones)) <= 100 + 1e-9


def test_a_zone_smaller_than_its_minimum_is_sampled_whole_and_others_keep_their_share() -> None:
    zones = zoned({"zone-a": 2500, "zone-b": 2490, "zone-c": 10})
    p = plan(zones, 2.0, 100, zones)
    per_zone = collections.Counter(zones[n] for n in p.fast)
    assert per_zone["zone-c"] == 10
    assert abs(per_zone["zone-a"] - per_zone["zone-b"]) <= 1


def test_one_node_more_moves_one_zones_boundary_only() -> None:
    zones = zoned({"zone-a": 2000, "zone-b": 2000, "zone-c": 1000})
    a = plan(zones, 2.0, 100, zones)
    b = plan({**zones, "zone-c-new": "zone-c"}, 2.0, 100, {**zones, "zone-c-new": "zone-c"})
    assert len(a.fast ^ b.fast) <= 3


@pytest.mark.parametrize("sizes", [{"a": 40, "b": 40, "c": 40}, {"a": 5, "b": 7}, {"a": 100, "b": 0}])
def test_allocate_gives_every_zone_its_minimum_and_never_more_than_it_has(sizes: dict[str, int]) -> None:
    shares = allocate(60, sizes)
    assert all(min(n, MIN_PER_ZONE) <= shares[z] <= n for z, n in sizes.items())
    minimums = sum(min(n, MIN_PER_ZONE) for n in sizes.values())
    assert sum(shares.values()) == max(minimums, min(60, sum(sizes.values())))


def test_the_sample_rotates_a_few_members_at_a_time() -> None:
    zones = zoned({"zone-a": 2000, "zone-b": 2000, "zone-c": 1000})
    t0 = 1_796_000_000.0
    # Every 10 s for 10 minutes: a member or two changes at a time, never the sample at once.
    steps = [plan(zones, 2.0, 100, zones, now_s=t0 + 10 * i) for i in range(61)]
    changes = [len(a.fast - b.fast) for a, b in itertools.pairwise(steps)]
    assert max(changes) <= 3 and sum(changes) > 0
    assert len({len(p.fast) for p in steps}) == 1  # the same size, the same budget
    later = plan(zones, 2.0, 100, zones, now_s=t0 + ROTATION_S)
    assert len(steps[0].fast & later.fast) < len(later.fast) / 4  # a rotation later: mostly new
    per_zone = collections.Counter(zones[n] for n in later.fast)
    assert min(per_zone.values()) >= MIN_PER_ZONE


def test_members_that_leave_stay_fast_until_their_successors_renew_fast() -> None:
    zones = zoned({"zone-a": 1000, "zone-b": 1000})
    old = plan(zones, 2.0, 100, zones, now_s=0.0)
    new = plan(zones, 2.0, 100, zones, now_s=ROTATION_S / 3)
    leaving, coming = old.fast - new.fast, new.fast - old.fast
    assert leaving and coming
    # None of the newcomers renews fast yet: every leaving member is kept.
    kept = hand_over(new, old.fast, ready=lambda n: n not in coming)
    assert kept.fast == new.fast | leaving
    # Those of zone-a do now: zone-a's leaving members go, zone-b's stay.
    ready = hand_over(new, old.fast, ready=lambda n: n not in coming or zones[n] == "zone-a")
    assert ready.fast == new.fast | {n for n in leaving if zones[n] == "zone-b"}
    # All of them do: the sample is the new one.
    assert hand_over(new, old.fast, ready=lambda n: True) == new
