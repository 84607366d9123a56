"""The actuator against the fake API: order, resume from any half-done state, exact restore."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from aggregator.act.scaler import Scaler
from aggregator.lead.scope import Scope
from aggregator.model.dependents import DEFAULT_DEPENDENTS, Dependent
from aggregator.model.records import IGNORE_SCALING, MELTDOWN, RECORD, REPLICAS, Record
from aggregator.model.settings import ScaleSettings, WatchSettings
from aggregator.model.verdict import Desired
from aggregator.observe.replicas import DependentState
from aggregator.observe.seeddependents import SeedDependents
from testenv.kube.controllers import CA, CONTROLLERS, KCM, MCM
from tests.unit.fakekube import FakeKube, Rule, server_error
from tests.unit.world import NS, Clock, deployment_path


def seed(**overrides: dict[str, Any]) -> FakeKube:
    kube = FakeKube()
    for name, replicas in CONTROLLERS.items():
        obj = {"spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": replicas}}
        obj.update(overrides.get(name, {}))
        kube.put(deployment_path(name), obj)
    return kube


def scaler(
    kube: FakeKube, clock: Clock, *, dry_run: bool = False, follow_polls: int = 0, **kw: Any
) -> Scaler:
    # The clock is fake: a level's follow polls (real sleeps) only where a test asks for them.
    settings = ScaleSettings(dry_run=dry_run, follow_polls=follow_polls, follow_poll_s=0.01)
    return Scaler(kube, NS, DEFAULT_DEPENDENTS, settings=settings, clock=clock, scope=Scope(), **kw)


def view(kube: FakeKube, name: str) -> tuple[int, dict[str, str]]:
    obj = kube.objects[deployment_path(name)]
    return obj["spec"]["replicas"], {
        k: v for k, v in (obj["metadata"].get("annotations") or {}).items() if k in (REPLICAS, MELTDOWN)
    }


async def converge(s: Scaler, clock: Clock, desired: Desired, ticks: int = 60) -> int:
    for tick in range(ticks):
        if await s.converge(desired, "test"):
            return tick
        clock.now += 1
    raise AssertionError(f"not converged: {s.snapshot()}")


async def test_down_records_first_then_scales_level_by_level_every_write_conditional() -> None:
    kube, clock = seed(), Clock()
    await converge(scaler(kube, clock), clock, Desired.SCALED_DOWN)
    assert {n: view(kube, n) for n in CONTROLLERS} == {
        n: (0, {REPLICAS: str(r), MELTDOWN: ""}) for n, r in CONTROLLERS.items()
    }
    for name, replicas in CONTROLLERS.items():  # ours beside them, and listable by its label
        meta = kube.objects[deployment_path(name)]["metadata"]
        assert Record.parse(meta["annotations"][RECORD]).replicas == replicas
        assert meta["labels"] == {RECORD: str(replicas)}  # the count again, should the annotation go
    patches = [(path, body) for method, path, body in kube.writes if method == "PATCH"]
    assert all(body["metadata"]["resourceVersion"] for _, body in patches)
    order = [path.rsplit("/", 2)[-2 if path.endswith("/scale") else -1] for path, _ in patches]
    for name in (MCM, CA, KCM):  # the record and the 0 in one write on the object, for each
        assert [(path, body["spec"]) for path, body in patches if path.startswith(deployment_path(name))] == [
            (deployment_path(name), {"replicas": 0})
        ]
    assert order.index(KCM) > max(order.index(MCM), order.index(CA))


async def test_the_written_object_is_the_state_no_read_after_a_write() -> None:
    kube, clock = seed(), Clock()
    gets: list[str] = []
    kube.on_request = lambda method, path: gets.append(path) if method == "GET" else None
    s = scaler(kube, clock)
    assert await s.converge(Desired.SCALED_DOWN, "test") is True
    # One read of each before its write: at 250 targets every read more was 750 more requests.
    assert sorted(gets) == sorted(deployment_path(n) for n in CONTROLLERS)


async def test_kcm_follows_in_the_same_tick_once_mcm_and_ca_have_stopped() -> None:
    kube, clock = seed(), Clock()
    kube.controller = False
    followed: list[str] = []

    def controller_later(method: str, path: str) -> None:
        # The deployment controller follows the 0 a moment after it is written.
        if method == "PATCH":
            target = path.removesuffix("/scale")
            asyncio.get_running_loop().call_later(0.03, kube.follow, target)
            followed.append(target)

    kube.on_request = controller_later

    def watch(d: Dependent) -> DependentState:  # a watch that is never behind
        return DependentState.from_object(d.name, kube.objects[deployment_path(d.name)])

    s = scaler(kube, clock, follow_polls=5, watched=watch)
    assert await s.converge(Desired.SCALED_DOWN, "test") is True  # one tick: KCM too
    assert {n: view(kube, n)[0] for n in CONTROLLERS} == dict.fromkeys(CONTROLLERS, 0)
    assert followed.index(deployment_path(KCM)) > max(
        followed.index(deployment_path(MCM)), followed.index(deployment_path(CA))
    )
    # Without the polls the level waits for the next tick; without a watch there are none (each
    # would be a GET).
    kube2 = seed()
    kube2.controller = False
    kube2.on_request = lambda method, path: (
        asyncio.get_running_loop().call_later(0.03, kube2.follow, path.removesuffix("/scale"))
        if method == "PATCH"
        else None
    )
    assert await scaler(kube2, Clock(), follow_polls=5).converge(Desired.SCALED_DOWN, "test") is False
    assert view(kube2, KCM)[0] == 3


async def test_an_event_that_hangs_never_holds_up_a_scale_down() -> None:
    kube, clock = seed(), Clock()
    kube.hang = Rule("POST", "/events$", server_error)
    s = scaler(kube, clock)
    ticks = await converge(s, clock, Desired.SCALED_DOWN)
    assert ticks <= 1 and {n: view(kube, n)[0] for n in CONTROLLERS} == dict.fromkeys(CONTROLLERS, 0)
    assert kube.hang.hits == 3  # every ScaledDown Event was sent, beside the writes
    await s.close()


@pytest.mark.parametrize(
    "half_done",
    [
        {MCM: {"metadata": {"annotations": {RECORD: Record(2).text(), REPLICAS: "2", MELTDOWN: ""}}}},
        {MCM: {"metadata": {"annotations": {RECORD: Record(2).text()}}}},  # DWD's keys not written yet
        {
            MCM: {
                "metadata": {"annotations": {RECORD: Record(2).text(), REPLICAS: "2", MELTDOWN: ""}},
                "spec": {"replicas": 0},
            },
            CA: {
                "metadata": {"annotations": {RECORD: Record(1).text(), REPLICAS: "1", MELTDOWN: ""}},
                "spec": {"replicas": 0},
            },
        },
    ],
)
async def test_a_half_done_scale_down_resumes_and_keeps_the_recorded_count(half_done: dict[str, Any]) -> None:
    kube, clock = seed(**half_done), Clock()
    for name, obj in half_done.items():
        kube.objects[deployment_path(name)]["metadata"].update(obj["metadata"])
    await converge(scaler(kube, clock), clock, Desired.SCALED_DOWN)
    assert view(kube, MCM) == (0, {REPLICAS: "2", MELTDOWN: ""})
    assert view(kube, KCM) == (0, {REPLICAS: "3", MELTDOWN: ""})


async def test_up_restores_exactly_in_order_with_the_delay_and_then_drops_the_record() -> None:
    kube, clock = seed(), Clock()
    s = scaler(kube, clock)
    await converge(s, clock, Desired.SCALED_DOWN)
    start = clock()
    await converge(s, clock, Desired.RUNNING)
    assert {n: view(kube, n) for n in CONTROLLERS} == {n: (r, {}) for n, r in CONTROLLERS.items()}
    assert clock() - start >= 30  # MCM's initial delay, counted from KCM's convergence
    ups = [p for m, p, b in kube.writes if p.endswith("/scale") and b["spec"]["replicas"] > 0]
    assert [p.rsplit("/", 2)[-2] for p in ups] == [KCM, MCM, CA]


def mark(kube: FakeKube, name: str, annotations: dict[str, str], replicas: int | None = None) -> None:
    obj = kube.objects[deployment_path(name)]
    obj["metadata"]["annotations"] = dict(annotations)
    if replicas is not None:
        obj["spec"]["replicas"] = replicas


@pytest.mark.parametrize(
    ("record", "dwd", "restored"),
    [
        (Record(5).text(), "5", 5),
        ('{"replicas": -1}', None, 1),  # unreadable, nothing beside it: dependency-watchdog's 1
        ("many", "4", 4),  # unreadable: dependency-watchdog's key we wrote beside it
        ("many", "x", 1),
    ],
)
async def test_our_record_is_restored_and_an_unreadable_one_falls_back(
    record: str, dwd: str | None, restored: int
) -> None:
    kube, clock = seed(), Clock()
    marks = {RECORD: record, MELTDOWN: ""} | ({REPLICAS: dwd} if dwd is not None else {})
    mark(kube, KCM, marks, replicas=0)
    await converge(scaler(kube, clock), clock, Desired.RUNNING)
    assert view(kube, KCM) == (restored, {})
    assert RECORD not in kube.objects[deployment_path(KCM)]["metadata"]["annotations"]


async def test_up_is_only_from_zero_a_running_count_is_somebodys_choice() -> None:
    kube, clock = seed(), Clock()
    mark(kube, KCM, {RECORD: Record(1).text(), REPLICAS: "1", MELTDOWN: ""})  # runs 3
    await converge(scaler(kube, clock), clock, Desired.RUNNING)
    assert view(kube, KCM) == (3, {})


async def test_ignored_and_absent_optional_dependents_are_left_alone() -> None:
    kube, clock = seed(), Clock()
    mark(kube, MCM, {IGNORE_SCALING: "true"})
    del kube.objects[deployment_path(CA)]  # optional
    await converge(scaler(kube, clock), clock, Desired.SCALED_DOWN)
    assert view(kube, MCM) == (2, {})
    assert view(kube, KCM) == (0, {REPLICAS: "3", MELTDOWN: ""})


async def test_dry_run_writes_nothing_either_way() -> None:
    kube, clock = seed(), Clock()
    s = scaler(kube, clock, dry_run=True)
    await converge(s, clock, Desired.SCALED_DOWN)
    mark(kube, KCM, {RECORD: Record(3).text(), REPLICAS: "3", MELTDOWN: ""}, replicas=0)
    await converge(s, clock, Desired.RUNNING)
    assert not kube.writes
    assert view(kube, KCM) == (0, {REPLICAS: "3", MELTDOWN: ""})
    assert s.metrics.dry_run_writes.get(target=NS, resource=MCM, direction="down") == 1


@pytest.mark.parametrize("desired", [Desired.RUNNING, Desired.SCALED_DOWN])
async def test_somebody_elses_marks_are_never_touched(desired: Desired) -> None:
    kube, clock = seed(), Clock()
    mark(kube, MCM, {MELTDOWN: ""})  # a stray mark: whose, we cannot know
    mark(kube, CA, {REPLICAS: "1", MELTDOWN: ""}, replicas=0)  # dependency-watchdog holds it down
    await converge(scaler(kube, clock), clock, desired)
    assert view(kube, CA) == (0, {REPLICAS: "1", MELTDOWN: ""})
    if desired is Desired.RUNNING:
        assert view(kube, MCM) == (2, {MELTDOWN: ""})
        assert not kube.writes


@pytest.mark.parametrize("text", ["{}", '{"replicas": 0}', '{"replicas": true}', "[1]", ""])
def test_an_unreadable_record_is_still_ours_with_its_count_unknown(text: str) -> None:
    assert Record.parse(text) == Record(None)


async def test_an_unreadable_record_held_down_gets_its_marks_from_the_fallback() -> None:
    kube, clock = seed(), Clock()
    mark(kube, KCM, {RECORD: "garbage", REPLICAS: "4"}, replicas=0)  # meltdown-protection-active lost
    await converge(scaler(kube, clock), clock, Desired.SCALED_DOWN)
    assert view(kube, KCM) == (0, {REPLICAS: "4", MELTDOWN: ""})
    assert Record.parse(kube.objects[deployment_path(KCM)]["metadata"]["annotations"][RECORD]).replicas == 4


async def test_dry_run_writes_nothing_even_to_clean_up_or_report() -> None:
    """Our record on a running KCM (raised by someone): a real run would remove it once ready; a
    missing MCM: a real run would record an Event. Dry-run does neither."""
    kube, clock = seed(), Clock()
    mark(kube, KCM, {RECORD: Record(3).text(), REPLICAS: "3", MELTDOWN: ""})
    del kube.objects[deployment_path(MCM)]
    s = scaler(kube, clock, dry_run=True)
    for desired in (Desired.RUNNING, Desired.SCALED_DOWN, Desired.RUNNING):
        for _ in range(5):
            await s.converge(desired, "test")
            clock.now += 1
    assert not kube.writes


async def test_dry_run_counts_each_write_it_would_make_a_clean_up_and_a_hand_back_too() -> None:
    """docs/settings.md: dry-run logs and counts each write it would make, not only the scales:
    our record on a running KCM removed once it runs, and our marks handed back."""
    kube, clock = seed(), Clock()
    mark(kube, KCM, {RECORD: Record(3).text(), REPLICAS: "3", MELTDOWN: ""})
    s = scaler(kube, clock, dry_run=True)
    await converge(s, clock, Desired.RUNNING)
    assert s.metrics.dry_run_writes.get(target=NS, resource=KCM, direction="up") >= 1
    assert not await s.hand_back("hibernating")
    assert s.metrics.dry_run_writes.get(target=NS, resource=KCM, direction="hand-back") == 1
    assert not kube.writes


async def test_with_the_seed_watch_a_scale_down_reads_nothing_and_a_conflict_asks_the_seed() -> None:
    kube, clock = seed(), Clock()
    watch = SeedDependents(kube, DEFAULT_DEPENDENTS, WatchSettings())
    watching = asyncio.create_task(watch.run())
    try:
        assert all(await asyncio.gather(*(i.first_list(5) for i in watch.informers.values())))
        gets: list[str] = []
        kube.on_request = lambda method, path: gets.append(path) if method == "GET" and NS in path else None
        # Someone else writes KCM after the watch saw it (this fake's watch delivers no events).
        kube.objects[deployment_path(KCM)]["metadata"]["resourceVersion"] = "changed-since"
        s = scaler(kube, clock, watched=functools.partial(watch.get, namespace=NS))
        assert await s.converge(Desired.SCALED_DOWN, "test") is False  # KCM's write conflicted
        assert gets == [] and {n: view(kube, n)[0] for n in (MCM, CA, KCM)} == {MCM: 0, CA: 0, KCM: 3}
        clock.now += 1
        assert await s.converge(Desired.SCALED_DOWN, "test") is True
        assert gets == [deployment_path(KCM)]  # after the conflict, from the seed; then written
        assert view(kube, KCM)[0] == 0
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def test_the_seed_watch_cannot_say_before_its_first_list_nor_of_what_it_has_not_seen() -> None:
    watch = SeedDependents(seed(), DEFAULT_DEPENDENTS, WatchSettings())
    kcm = DEFAULT_DEPENDENTS[0]
    assert watch.get(kcm, NS) is None
    watching = asyncio.create_task(watch.run())
    try:
        assert all(await asyncio.gather(*(i.first_list(5) for i in watch.informers.values())))
        seen = watch.get(kcm, NS)
        assert seen is not None and (seen.exists, seen.replicas) == (True, CONTROLLERS[KCM])
        # Not in its view (created a moment ago, perhaps): the seed is asked, not "missing" told.
        assert watch.get(kcm, "shoot--p--other") is None
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def test_a_watch_behind_our_scale_up_is_not_taken_for_the_seed_when_the_shoot_relapses() -> None:
    """The watch still shows KCM held at 0 with our record when the shoot relapses right after
    its scale-up: that view is older than what the scale-up's writes answered, and KCM is
    scaled down again, not taken for down already (MCM's level would then pass its gate)."""
    kcm = DEFAULT_DEPENDENTS[0]
    kube, clock = seed(), Clock()
    settings = ScaleSettings(follow_polls=0)
    assert await Scaler(kube, NS, [kcm], settings=settings, clock=clock, scope=Scope()).converge(
        Desired.SCALED_DOWN, "cut"
    )
    frozen = DependentState.from_object(KCM, kube.objects[deployment_path(KCM)])
    s = Scaler(kube, NS, [kcm], settings=settings, clock=clock, scope=Scope(), watched=lambda _d: frozen)
    for _ in range(5):
        if await s.converge(Desired.RUNNING, "healed"):
            break
        clock.now += 1
    assert view(kube, KCM) == (3, {})
    for _ in range(5):
        if await s.converge(Desired.SCALED_DOWN, "relapse"):
            break
        clock.now += 1
    assert view(kube, KCM) == (0, {REPLICAS: "3", MELTDOWN: ""})


async def test_a_label_of_an_earlier_version_is_ours_and_rewritten_with_the_count() -> None:
    """Records written before the label carried the count say "true": still ours (the count from
    the annotation), and the label is brought up to date while held down."""
    kube, clock = seed(), Clock()
    s = scaler(kube, clock)
    await converge(s, clock, Desired.SCALED_DOWN)
    meta = kube.objects[deployment_path(KCM)]["metadata"]
    meta["labels"][RECORD] = "true"
    s.forget()
    await converge(s, clock, Desired.SCALED_DOWN)
    assert meta["labels"][RECORD] == str(CONTROLLERS[KCM])
