"""The fleet simulator (testenv/worlds/agent_fleet.py) against a real shoot API server and the
real aggregator.

The simulator is what the scale benchmarks trust for their figures, so it is held to
the chain end to end: its renewals must land, it must adopt the intervals the budget
hands out, and its silence must be what the aggregator acts on.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Iterator

import pytest

from aggregator.act import budget
from core.durations import parse_duration
from core.lease import RENEW_INTERVAL
from testenv.base.wait import wait_for
from testenv.kube.controllers import CONTROLLERS, DOWN
from testenv.worlds.agent_fleet import ZONE_LABEL, ZONES, Fleet, FleetThread
from testenv.worlds.shoot_world import FAST_ENV, Shoot

pytestmark = pytest.mark.integration

NODES = 75  # three zones of 25: the sample takes 20 of each (the per-zone minimum), 15 stay slow
# Under FAST_ENV's 500 ms interval a budget of 40 writes/s covers 20 fast nodes: the rest
# are handed a slow interval, so the test covers both paces.
BUDGET = 40.0


@pytest.fixture
def fleet(shoot: Shoot) -> Iterator[FleetThread]:
    shoot.setup(nodes=0)
    admin = shoot.shoot.admin
    f = FleetThread(Fleet(shoot.shoot.url, shoot.shoot.ca_file, (str(admin.cert), str(admin.key))))
    try:
        yield f
    finally:
        f.close()


def test_fleet_renews_and_its_silence_scales_down_and_back(shoot: Shoot, fleet: FleetThread) -> None:
    names = fleet.add(NODES)
    nodes = shoot.shoot_admin.get("/api/v1/nodes")["items"]
    zones = collections.Counter(n["metadata"]["labels"][ZONE_LABEL] for n in nodes)
    assert zones == {z: NODES // 3 + (1 if i < NODES % 3 else 0) for i, z in enumerate(ZONES)}
    fleet.start_renewing()
    shoot.start_aggregator({"DWD_WRITE_BUDGET": str(BUDGET)})

    fast_s = parse_duration(FAST_ENV["DWD_RENEW_INTERVAL"])

    # The sample as the aggregator hands it out (drawn per zone, and rotating: read, not
    # recomputed), and every simulated agent on the interval its own lease names.
    def adopted() -> dict[str, float] | None:
        leases = shoot.leases()
        want = {n: parse_duration(x["metadata"]["annotations"][RENEW_INTERVAL]) for n, x in leases.items()}
        have = {n.name: n.interval_s for n in fleet.fleet.nodes.values()}
        return want if len(want) == NODES and have == want else None

    want = wait_for(adopted, 30, "every simulated agent on the interval its annotation names", every_s=0.2)
    sample = {n for n, interval in want.items() if interval == fast_s}
    assert 0 < len(sample) < NODES
    assert len(sample) >= len(budget.plan(names, fast_s, BUDGET).fast)
    leases = shoot.leases()
    assert set(leases) == set(names)
    for name, lease in leases.items():
        assert lease["spec"]["holderIdentity"] == name
        assert lease["spec"]["renewTime"]
    # The fast ones keep renewing, seen on the server: every member still in the sample
    # (it rotates a member at a time) renews past what was read, bounded for a loaded
    # machine that holds the fleet's thread for a moment (a one-shot look after three
    # intervals failed in CI with four workers on the machine).
    before = {n: leases[n]["spec"]["renewTime"] for n in sample}

    def sample_renewed() -> bool:
        after = shoot.leases()
        return all(after[n]["spec"]["renewTime"] > before[n] for n in sample & fleet.at_interval(fast_s))

    wait_for(sample_renewed, 10 * fast_s, "every fast node renewed on the server", every_s=fast_s)
    # Renewals first: the fleet keeps renewing between the two reads.
    renewed = sum(n.renewals for n in fleet.fleet.nodes.values())
    assert fleet.sent("PATCH", "leases", "200") >= renewed > 0
    time.sleep(2)  # the aggregator judges after one lease duration of view

    # 70 % of the nodes, 70 % of the sample among them: the sample sees what the fleet has.
    rng = random.Random(7)
    fast, slow = sorted(sample), sorted(set(names) - sample)
    cut = rng.sample(fast, round(0.7 * len(fast))) + rng.sample(slow, round(0.7 * len(slow)))
    assert len(cut) == round(0.7 * NODES)
    sampler = shoot.sampler()
    t0 = time.monotonic()
    fleet.silence(cut)
    wait_for(lambda: shoot.replicas() == DOWN, 30, "every controller scaled down", every_s=0.1)
    took = time.monotonic() - t0
    # lease duration 2 s + confirm 1 s + ticks and the levels
    assert took < 10, took
    first_down = sampler.first(lambda s: any(v == 0 for v in s.replicas.values()), after=t0)
    assert first_down is not None and first_down.t - t0 > 2.0, "scaled down before a lease could be stale"
    silent = set(cut)
    assert not silent & set(fleet.fleet.renewed_within(2.5 * fast_s))

    # The rest of the sample renews on: the sample as it is now (it rotates a member at a
    # time, and a member that leaves it renews slowly from then), bounded for a loaded
    # machine that holds the fleet's thread for a moment.
    def others_renewing() -> bool:
        now = fleet.at_interval(fast_s) - silent
        return len(now) >= len(sample - silent) and now <= set(fleet.fleet.renewed_within(2.5 * fast_s))

    wait_for(others_renewing, 5, "the rest of the sample renewing at its pace")

    fleet.resume()
    wait_for(lambda: shoot.replicas() == CONTROLLERS, 40, "every controller back", every_s=0.2)

    # The sample (as it is now: it rotates a member at a time) back at its pace. A bound on
    # when, not on the pace, which is checked above: a loaded machine may hold the fleet's
    # thread for a moment.
    def sample_renewing() -> bool:
        now = fleet.fleet.at_interval(fast_s)
        return len(now) >= len(sample) and now <= set(fleet.fleet.renewed_within(2.5 * fast_s))

    wait_for(sample_renewing, 30, "the sample renewing again")  # 10 s ran out under four workers
