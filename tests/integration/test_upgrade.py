"""A release replaced while it holds a shoot down, as a seed's rollout does it whatever the
weather: the previous release (CHANGELOG.md names its commit; its sources unpacked from git,
run as its own process) lowers the controllers on a cut; this release starts beside it as a
standby, the previous one is stopped (SIGTERM) and this one takes over while the cut lasts.
The shoot must stay held until the heal, and every controller come back with exactly its
replicas. The same the other way: this release holds, the previous one takes over (a rollback).
And this release as the older one: the next release's records (this release's, their format
bumped and a key added, as a later release writes them: formats only add keys) found by this
release taking over, as on a rollback from the next release.

Each release reads the other's record: 0.2.0's has no format (1), this one's is format 2.
In the aggregators' hand-over the agents are the harness's lease driver (what the agent
writes, unchanged since 0.2.0); the last test rolls the agents themselves, the previous
release's processes replaced by this one's all at once, under this release's aggregator.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from aggregator.model.records import FORMAT, MELTDOWN, RECORD, REPLICAS
from core.lease import parse_micro_time
from testenv.base import releases
from testenv.base.process import Process, stop_all
from testenv.base.wait import wait_for
from testenv.gardener.apply import apply, kustomize_build
from testenv.kube.controllers import CONTROLLERS, DOWN, KCM
from testenv.kube.controlplane import free_port
from testenv.kube.standins import DEPLOYMENTS
from testenv.worlds.shoot_world import Sample, Shoot
from tests.integration.test_move import Candidates, candidates, new_agent

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODES = 6
HOLD_S = 6.0  # three lease durations held by the new holder before the heal


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    version, commit = releases.previous()
    return version, releases.unpack(commit, tmp_path_factory.mktemp(f"release-{version}"))


def held(sample: Sample) -> bool:
    return sample.replicas == DOWN


def restored(shoot: Shoot) -> bool:
    """Every controller at its replicas, and no mark left: our record (annotation and label),
    dependency-watchdog's ``replicas`` and ``meltdown-protection-active`` beside it."""
    metas = [d["metadata"] for d in shoot.deployments().values()]
    marked = [
        m["name"]
        for m in metas
        if {RECORD, REPLICAS, MELTDOWN} & set(m.get("annotations") or {}) or RECORD in (m.get("labels") or {})
    ]
    return shoot.replicas() == CONTROLLERS and not marked


def as_next_release(shoot: Shoot) -> None:
    """Every record rewritten as a hypothetical next release writes it: this release's, its
    format bumped and a key this release does not know added."""
    for name in CONTROLLERS:
        record = {**json.loads(shoot.annotation(name, RECORD) or "{}"), "format": FORMAT + 1}
        record["episode"] = {"id": "next-1", "witnesses": ["agent", "kubelet"]}
        path = f"{DEPLOYMENTS.format(ns=shoot.namespace)}/{name}"
        shoot.seed_admin.merge_patch(path, {"metadata": {"annotations": {RECORD: json.dumps(record)}}})


def hand_over(
    shoot: Shoot,
    first: Callable[[], Process],
    second: Callable[[], Process],
    lowered_as: Callable[[Shoot], None] = lambda _shoot: None,
) -> dict[str, float]:
    """``first`` leads and holds the shoot down on a cut (its records then rewritten by
    ``lowered_as``); ``second`` takes over while the cut lasts; the heal. Returns when each step
    happened (time.monotonic())."""
    sampler = shoot.sampler()
    old = first()
    shoot.wait_leases_renewed()  # the aggregator creates them
    wait_for(lambda: shoot.election_holder() != "", 30, "the first release leading")
    leader = shoot.election_holder()
    time.sleep(4)  # healthy for two lease durations: judged, nothing to do
    at = {"cut": time.monotonic()}
    shoot.driver.alive.clear()
    wait_for(lambda: shoot.replicas() == DOWN, 30, f"the first release lowering ({old.log_path})")
    at["lowered"] = time.monotonic()
    lowered_as(shoot)
    # Which release lowered, by the record it wrote: 0.2.0's has no format (1), this one's 2.
    records = {n: shoot.annotation(n, RECORD) for n in CONTROLLERS}
    at["format"] = json.loads(records[KCM] or "{}").get("format", 1)
    new = second()
    time.sleep(2)  # the standby judging beside the leader
    old.stop()
    wait_for(lambda: shoot.election_holder() not in ("", leader), 30, f"the takeover ({new.log_path})")
    at["taken_over"] = time.monotonic()
    time.sleep(HOLD_S)
    # Taken over as written: a record the new holder could not read it would write again,
    # from dependency-watchdog's key beside it (which hides the fault from the replicas).
    assert {n: shoot.annotation(n, RECORD) for n in CONTROLLERS} == records, "the record was rewritten"
    at["healed"] = time.monotonic()
    shoot.driver.alive.update(f"node-{i}" for i in range(NODES))
    wait_for(lambda: restored(shoot), 60, f"every controller back ({new.log_path})")
    at["restored"] = time.monotonic()
    healthy = sampler.between(at["cut"] - 4, at["cut"])
    assert all(s.replicas == CONTROLLERS for s in healthy), "lowered while healthy"
    during = sampler.between(at["lowered"], at["healed"])
    assert all(held(s) for s in during), (
        f"raised during the hand-over: {next(s for s in during if not held(s))}"
    )
    at["samples_lowered_while_healthy"] = sum(s.replicas != CONTROLLERS for s in healthy)
    at["samples_held"] = len(during)
    return at


def report(what: str, at: dict[str, float]) -> None:
    t0, healed = at["cut"], at["healed"]
    print(
        f"\n{what}: lowered {at['lowered'] - t0:.1f}s after the cut (record format "
        f"{at['format']:.0f}), taken over at "
        f"{at['taken_over'] - t0:.1f}s, healed at {healed - t0:.1f}s, restored "
        f"{at['restored'] - healed:.1f}s after the heal; samples lowered while healthy: "
        f"{at['samples_lowered_while_healthy']:.0f}; held through the hand-over: "
        f"{at['samples_held']:.0f} samples, all at 0; replicas after: {CONTROLLERS}"
    )


@pytest.mark.parametrize("direction", ["upgrade", "rollback", "rollback-from-next"])
def test_a_release_change_while_held_down_keeps_every_replica(
    shoot: Shoot, previous_release: tuple[str, Path], direction: str
) -> None:
    """upgrade: the previous release holds, this one takes over; rollback: the other way;
    rollback-from-next: the next release holds (its records of a format this release does not
    know), this one takes over."""
    version, tree = previous_release
    shoot.setup(nodes=NODES)
    election = shoot.election_env()
    releases_in_order = {"upgrade": [tree, None], "rollback": [None, tree]}.get(direction, [None, None])
    first, second = (
        functools.partial(shoot.start_aggregator, source=t, seed=None, env=election)
        for t in releases_in_order
    )
    from_next = direction == "rollback-from-next"
    at = hand_over(shoot, first, second, as_next_release if from_next else lambda _shoot: None)
    lowered_by = {"upgrade": 1, "rollback": FORMAT}.get(direction, FORMAT + 1)
    assert at["format"] == lowered_by, "another release lowered"
    said = {"upgrade": f"upgrade from {version}", "rollback": f"rollback to {version}"}
    report(said.get(direction, f"rollback from the next release (format {FORMAT + 1})"), at)


def renewed_since(shoot: Shoot, since: datetime) -> bool:
    stamps = [(x.get("spec") or {}).get("renewTime") for x in shoot.leases().values()]
    return len(stamps) == NODES and all(t and parse_micro_time(t) > since for t in stamps)


def test_the_agents_rolled_at_once_to_this_release_lower_nothing(
    shoot: Shoot, previous_release: tuple[str, Path]
) -> None:
    """The DaemonSet rolled with maxUnavailable 100%: every agent of the previous release stops
    at once (SIGTERM: each marks its lease released, which counts on its last renewal until that
    is a lease duration old), this release's start and renew. Nothing lowered, no node judged
    stale, and no node out of the verdict at any moment."""
    version, tree = previous_release
    names = [f"node-{i}" for i in range(NODES)]
    shoot.setup(nodes=NODES)
    shoot.driver.alive.clear()  # the agents renew, not the harness
    base = kustomize_build(ROOT / "manifests" / "shoot" / "base")
    apply(shoot.shoot_admin, [d for d in base if d["kind"] != "DaemonSet"])
    port = free_port()
    shoot.start_aggregator({"DWD_METRICS_ADDR": f"127.0.0.1:{port}"})
    agents = [new_agent(shoot, n, tree) for n in names]
    judged = Candidates(port)
    try:
        wait_for(lambda: candidates(port) == NODES, 40, f"every node judged on {version}'s agents")
        sampler = shoot.sampler()
        judged.start()
        time.sleep(2)
        rolled = time.monotonic()
        stop_all(agents)
        agents += [new_agent(shoot, n) for n in names]
        since = datetime.now(UTC)
        wait_for(lambda: renewed_since(shoot, since), 30, "every lease renewed by this release's agents")
        back_s = time.monotonic() - rolled
        time.sleep(2)
        judged.stop()
        window = sampler.between(rolled - 1)
        assert all(s.replicas == CONTROLLERS for s in window), "lowered during the roll"
        assert max(judged.stale) == 0, judged.stale
        assert min(judged.seen) == NODES, f"a node out of the verdict during the roll: {judged.seen}"
        print(
            f"\nagents rolled from {version}, all at once: every lease renewed by this release "
            f"{back_s:.1f}s after the roll began; nodes judged {min(judged.seen)}..{max(judged.seen)} "
            f"of {NODES}, at most {max(judged.stale)} stale; samples with a controller lowered: 0 of "
            f"{len(window)}"
        )
    finally:
        judged.stop()
        for a in agents:
            a.kill()
