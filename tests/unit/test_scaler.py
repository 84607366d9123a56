"""The actuator against the fake API: order, resume from any half-done state, exact restore."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.decider import Desired
from aggregator.dependents import DEFAULT_DEPENDENTS
from aggregator.scaler import IGNORE_SCALING, MELTDOWN, REPLICAS, Scaler
from aggregator.settings import Scaling
from testenv.standins import CONTROLLERS
from tests.unit.fakekube import FakeKube
from tests.unit.world import NS, Clock, deployment_path

KCM, MCM, CA = "kube-controller-manager", "machine-controller-manager", "cluster-autoscaler"


def seed(**overrides: dict[str, Any]) -> FakeKube:
    kube = FakeKube()
    for name, replicas in CONTROLLERS.items():
        obj = {"spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": replicas}}
        obj.update(overrides.get(name, {}))
        kube.put(deployment_path(name), obj)
    return kube


def scaler(kube: FakeKube, clock: Clock, *, dry_run: bool = False, **kw: Any) -> Scaler:
    settings = Scaling(dry_run=dry_run)
    return Scaler(kube, NS, DEFAULT_DEPENDENTS, settings=settings, clock=clock, **kw)  # type: ignore[arg-type]


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
    patches = [(path, body) for method, path, body in kube.writes if method == "PATCH"]
    assert all(body["metadata"]["resourceVersion"] for _, body in patches)
    order = [path.rsplit("/", 2)[-2 if path.endswith("/scale") else -1] for path, _ in patches]
    for name in (MCM, CA, KCM):  # the record before the scale, for each
        first = order.index(name)
        assert patches[first][0] == deployment_path(name)
    assert order.index(KCM) > max(order.index(MCM), order.index(CA))


@pytest.mark.parametrize(
    "half_done",
    [
        {MCM: {"metadata": {"annotations": {REPLICAS: "2", MELTDOWN: ""}}}},  # crashed after the record
        {MCM: {"metadata": {"annotations": {REPLICAS: "2"}}}},  # after half the record
        {
            MCM: {"metadata": {"annotations": {REPLICAS: "2", MELTDOWN: ""}}, "spec": {"replicas": 0}},
            CA: {"metadata": {"annotations": {REPLICAS: "1", MELTDOWN: ""}}, "spec": {"replicas": 0}},
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


@pytest.mark.parametrize(("record", "restored"), [("5", 5), ("-1", 1), ("many", 1)])
async def test_the_record_is_restored_and_an_unusable_one_means_one(record: str, restored: int) -> None:
    kube, clock = seed(), Clock()
    kube.objects[deployment_path(KCM)]["metadata"]["annotations"] = {REPLICAS: record, MELTDOWN: ""}
    kube.objects[deployment_path(KCM)]["spec"]["replicas"] = 0
    await converge(scaler(kube, clock), clock, Desired.RUNNING)
    assert view(kube, KCM) == (restored, {})


async def test_more_replicas_than_recorded_are_left_alone() -> None:
    kube, clock = seed(), Clock()
    kube.objects[deployment_path(KCM)]["metadata"]["annotations"] = {REPLICAS: "1", MELTDOWN: ""}
    await converge(scaler(kube, clock), clock, Desired.RUNNING)
    assert view(kube, KCM) == (3, {})


async def test_ignore_scaling_and_absent_dependents() -> None:
    kube, clock = seed(), Clock()
    kube.objects[deployment_path(CA)]["metadata"]["annotations"] = {IGNORE_SCALING: "true"}
    del kube.objects[deployment_path(MCM)]
    await converge(scaler(kube, clock), clock, Desired.SCALED_DOWN)
    assert view(kube, CA) == (1, {})
    assert view(kube, KCM) == (0, {REPLICAS: "3", MELTDOWN: ""})


async def test_dry_run_never_writes_a_scale_down_but_restores() -> None:
    kube, clock = seed(), Clock()
    s = scaler(kube, clock, dry_run=True)
    await converge(s, clock, Desired.SCALED_DOWN)
    assert not kube.writes
    kube.objects[deployment_path(KCM)]["metadata"]["annotations"] = {REPLICAS: "3", MELTDOWN: ""}
    kube.objects[deployment_path(KCM)]["spec"]["replicas"] = 0
    await converge(s, clock, Desired.RUNNING)
    assert view(kube, KCM) == (3, {})


async def test_a_stray_protection_mark_is_removed_and_nothing_else_is_touched() -> None:
    kube, clock = seed(), Clock()
    kube.objects[deployment_path(MCM)]["metadata"]["annotations"] = {MELTDOWN: ""}
    await converge(scaler(kube, clock), clock, Desired.RUNNING)
    assert {n: view(kube, n) for n in CONTROLLERS} == {n: (r, {}) for n, r in CONTROLLERS.items()}
    assert [p for _, p, _ in kube.writes] == [deployment_path(MCM)]
