"""Records that say which release wrote them (aggregator/model/records.py FORMAT): this release
reads the format before it (0.2.0's, without the key) and restores it; a later release's it
leaves exactly as it is, and says so once, as an Event and on the status page."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aggregator.decide.decider import Desired
from aggregator.model.records import FORMAT, MELTDOWN, RECORD, REPLICAS, Record, record_marks
from testenv.controllers import CONTROLLERS, KCM
from tests.unit.test_scaler import converge, scaler, seed
from tests.unit.world import Clock, deployment_path


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
    later = Record.parse(json.dumps({"format": 3, "taken": {"replicas": 3}}))
    assert (later.replicas, later.format, later.newer) == (None, 3, True)


async def test_a_record_of_the_release_before_is_restored_exactly() -> None:
    old = json.dumps({"replicas": 3, "target": "t", "at": "2026-12-04T10:00:00Z"})
    kube, clock = seed(**{KCM: held(old, 3)}), Clock()
    await converge(scaler(kube, clock), clock, Desired.RUNNING)
    obj = kube.objects[deployment_path(KCM)]
    assert obj["spec"]["replicas"] == 3 and RECORD not in (obj["metadata"].get("annotations") or {})


async def test_a_later_releases_record_is_left_as_it_is_and_told_once() -> None:
    later = json.dumps({"format": FORMAT + 1, "taken": {"replicas": 3}})
    kube, clock = seed(**{KCM: held(later, 3)}), Clock()
    s = scaler(kube, clock)
    await converge(s, clock, Desired.RUNNING)
    await converge(s, clock, Desired.RUNNING)
    assert await s.hand_back("hibernating")
    await asyncio.sleep(0)  # the Events go beside the writes
    obj = kube.objects[deployment_path(KCM)]
    assert obj["spec"]["replicas"] == 0 and obj["metadata"]["annotations"][RECORD] == later
    assert not [w for w in kube.writes if w[0] == "PATCH" and w[1].startswith(deployment_path(KCM))]
    told = [
        body
        for method, _, body in kube.writes
        if method == "POST" and body["reason"] == "RecordFromNewerRelease"
    ]
    assert len(told) == 1 and f"format {FORMAT + 1}" in told[0]["message"], told
    assert s.snapshot()[KCM]["newer_format"] == FORMAT + 1
    # The others came back as ever.
    assert all(
        kube.objects[deployment_path(n)]["spec"]["replicas"] == r for n, r in CONTROLLERS.items() if n != KCM
    )
    await s.close()


def test_record_marks_carry_the_format() -> None:
    assert json.loads(record_marks(Record(2))[RECORD])["format"] == FORMAT
