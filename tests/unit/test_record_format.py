"""Records that say which release wrote them (aggregator/model/records.py FORMAT): this release
reads the format before it (0.2.0's, without the key) and restores it; a later release's it
reads as far as the keys it knows and restores from what it can read (the record's count, else
dependency-watchdog's ``replicas``), else hands it back; and says so once, as an Event and on
the status page. A rollback never strands a controller at 0 on a healthy shoot."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from aggregator.model.records import FORMAT, MELTDOWN, RECORD, REPLICAS, Record, record_marks
from aggregator.model.verdict import Desired, Phase
from testenv.kube.controllers import CONTROLLERS, DOWN, KCM
from tests.unit.test_other_writers import Targets, ours, quick_fleet, until_real
from tests.unit.test_scaler import converge, scaler, seed
from tests.unit.world import Clock, World, deployment_path


def held(record: str, replicas: int) -> dict[str, Any]:
    """A dependent at 0 carrying ``record`` and dependency-watchdog's keys beside it."""
    return {
        "spec": {"replicas": 0},
        "status": {"replicas": 0},
        "metadata": {
            "annotations": {RECORD: record, REPLICAS: str(replicas), MELTDOWN: ""},
            "labels": {RECORD: str(replicas)},
        },
    }


def test_this_release_writes_its_format_and_reads_the_one_before() -> None:
    written = json.loads(Record.now(3, "shoot--p--a").text())
    assert written["format"] == FORMAT == 2 and written["replicas"] == 3
    before = Record.parse(json.dumps({"replicas": 3, "target": "t", "at": "2026-12-04T10:00:00Z"}))
    assert (before.replicas, before.format, before.newer) == (3, 1, False)
    # A later release's: read as far as this release knows it; what it added is extra.
    later = Record.parse(json.dumps({"format": 3, "replicas": 3, "target": "t", "episode": {"id": 7}}))
    assert (later.replicas, later.target, later.format, later.newer) == (3, "t", 3, True)
    moved = Record.parse(json.dumps({"format": 3, "taken": {"replicas": 3}}))
    assert (moved.replicas, moved.format, moved.newer) == (None, 3, True)
    assert (Record.parse("{").replicas, Record.parse("[]").format) == (None, FORMAT)


async def test_a_record_of_the_release_before_is_restored_exactly() -> None:
    old = json.dumps({"replicas": 3, "target": "t", "at": "2026-12-04T10:00:00Z"})
    kube, clock = seed(**{KCM: held(old, 3)}), Clock()
    await converge(scaler(kube, clock), clock, Desired.RUNNING)
    obj = kube.objects[deployment_path(KCM)]
    assert obj["spec"]["replicas"] == 3 and RECORD not in (obj["metadata"].get("annotations") or {})


async def test_a_later_releases_record_is_restored_from_dependency_watchdogs_key_and_told_once() -> None:
    """Its count under a key this release does not know: dependency-watchdog's ``replicas``
    beside it says what comes back. (Until issue 56 such a record was never written or cleared,
    and the dependent stayed at 0 on a healthy shoot.)"""
    later = json.dumps({"format": FORMAT + 1, "taken": {"replicas": 3}})
    kube, clock = seed(**{KCM: held(later, 3)}), Clock()
    s = scaler(kube, clock)
    await converge(s, clock, Desired.RUNNING)
    await converge(s, clock, Desired.RUNNING)
    await asyncio.sleep(0)  # the Events go beside the writes
    obj = kube.objects[deployment_path(KCM)]
    assert obj["spec"]["replicas"] == 3 and not {RECORD, REPLICAS, MELTDOWN} & set(
        obj["metadata"]["annotations"]
    )
    told = [
        body
        for method, _, body in kube.writes
        if method == "POST" and body["reason"] == "RecordFromNewerRelease"
    ]
    assert len(told) == 1 and f"format {FORMAT + 1}" in told[0]["message"], told
    assert "3 to restore" in told[0]["message"], told
    # The others came back as ever.
    assert all(kube.objects[deployment_path(n)]["spec"]["replicas"] == r for n, r in CONTROLLERS.items())
    await s.close()


async def test_a_later_releases_record_is_handed_back_with_ours() -> None:
    """gardenlet hibernating the shoot: the marks of a later release's record go as ours do."""
    later = json.dumps({"format": FORMAT + 1, "replicas": 3, "episode": "e-7"})
    kube = seed(**{KCM: held(later, 3)})
    s = scaler(kube, Clock())
    assert await s.hand_back("hibernating")
    meta = kube.objects[deployment_path(KCM)]["metadata"]
    assert kube.objects[deployment_path(KCM)]["spec"]["replicas"] == 0
    assert not {RECORD, MELTDOWN} & set(meta["annotations"]) and RECORD not in (meta.get("labels") or {})
    await s.close()


def test_record_marks_carry_the_format() -> None:
    assert json.loads(record_marks(Record(2))[RECORD] or "{}")["format"] == FORMAT


# -- A rollback never strands: a later release's record, read as far as this release knows.


def next_release(record: dict[str, Any], *, count: bool = True) -> str:
    """``record`` (this release's) as a hypothetical next release writes it: its format bumped, a
    field this release does not know added; without ``count``, its count moved under a key this
    release does not know either."""
    later = {**record, "format": FORMAT + 1, "episode": {"id": "e-7", "witnesses": 2}}
    if not count:
        later["taken"] = {"replicas": later.pop("replicas")}
    return json.dumps(later, sort_keys=True)


def bumped(w: World, *, count: bool = True) -> None:
    """Every record of ours on the seed rewritten as the next release would have written it."""
    for name in CONTROLLERS:
        ann = w.seed.objects[deployment_path(name)]["metadata"]["annotations"]
        w.annotate(name, {RECORD: next_release(json.loads(ann[RECORD]), count=count)})


def cleared(w: World) -> bool:
    """Every controller at its replicas, and no mark of ours or dependency-watchdog's left."""
    metas = [w.seed.objects[deployment_path(n)]["metadata"] for n in CONTROLLERS]
    return w.restored() and not any(
        RECORD in (m.get("annotations") or {}) or RECORD in (m.get("labels") or {}) for m in metas
    )


@pytest.mark.parametrize("count", [True, False], ids=["count-readable", "count-unknown"])
async def test_a_later_releases_record_on_a_healthy_shoot_is_restored_and_cleared(count: bool) -> None:
    """A start on a healthy shoot finds each controller at 0 with a record of format 3 and
    dependency-watchdog's keys beside it: after the recovery period every one is back (from the
    record's ``replicas`` where it has one, else from dependency-watchdog's key) and unmarked."""
    w = World()
    for name, replicas in CONTROLLERS.items():
        mine = json.loads(Record(replicas, "shoot", "2026-12-08T10:00:00Z").text())
        w.annotate(name, {**record_marks(Record(replicas)), RECORD: next_release(mine, count=count)})
        w.seed.objects[deployment_path(name)]["metadata"]["labels"] = {RECORD: str(replicas)}
        w.scale(name, 0)
    await w.until(lambda: w.target.memory.phase is Phase.HEALTHY, 30, "judged healthy")
    await w.until(lambda: cleared(w), 60, "every controller back, its marks gone")
    assert w.replicas() == CONTROLLERS


async def test_a_rollback_in_the_middle_of_an_outage_holds_then_restores_every_replica() -> None:
    """The next release lowered the controllers on a cut (its records, format 3); it is rolled
    back to this one while the cut lasts: held (nothing raised, its own verdict), and after the
    heal every controller back with exactly its replicas, every mark gone."""
    w = World()
    await w.settle()
    await w.outage()
    bumped(w)
    records = {n: ours(w, n) for n in CONTROLLERS}
    w.new_target()  # this release, started in the cut
    mark = len(w.trace)
    await w.run(30)
    assert all(r == DOWN for _, r in w.trace[mark:]), "raised during the cut"
    assert {n: ours(w, n) for n in CONTROLLERS} == records, "held as written, not rewritten"
    shown = w.target.snapshot()["dependents"]
    assert {n: shown[n]["newer_format"] for n in CONTROLLERS} == dict.fromkeys(CONTROLLERS, FORMAT + 1)
    w.alive |= set(w.names)
    await w.until(lambda: cleared(w), 90, "every controller back after the heal")


async def test_a_later_releases_record_without_any_count_is_handed_back() -> None:
    """Neither the record nor dependency-watchdog's key says what to restore: our marks go, the
    replicas are left to the controller's owner (gardenlet), and an Event says so."""
    later = json.dumps({"format": FORMAT + 1, "taken": {"replicas": 3}})
    obj = held(later, 3)
    del obj["metadata"]["annotations"][REPLICAS]
    kube, clock = seed(**{KCM: obj}), Clock()
    s = scaler(kube, clock)
    await converge(s, clock, Desired.RUNNING)
    await asyncio.sleep(0)  # the Events go beside the writes
    meta = kube.objects[deployment_path(KCM)]["metadata"]
    assert kube.objects[deployment_path(KCM)]["spec"]["replicas"] == 0
    assert not {RECORD, MELTDOWN} & set(meta["annotations"]) and RECORD not in (meta.get("labels") or {})
    reasons = [body["reason"] for method, _, body in kube.writes if method == "POST"]
    assert "HandedBack" in reasons and "RecordFromNewerRelease" in reasons, reasons
    await s.close()


async def test_a_later_releases_record_where_no_target_serves_is_restored_by_the_sweep() -> None:
    w = World()
    await w.settle()
    await w.outage()
    bumped(w)
    # The target was removed (its entry gone) and this release, rolled back, leads the seed.
    fleet = quick_fleet(w)
    task = asyncio.create_task(fleet.run(Targets()))
    try:
        assert await until_real(lambda: cleared(w)), (
            w.replicas(),
            {n: w.annotations(n) for n in CONTROLLERS},
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
