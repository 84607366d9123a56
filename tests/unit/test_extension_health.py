"""What the Extension tells gardenlet of a served shoot's protection (aggregator/extension/health.py)
and the heartbeat Lease, against the fake seed."""

from __future__ import annotations

from dataclasses import dataclass

from aggregator.extension.health import HEARTBEAT, LEASES, health
from aggregator.extension.reconciler import HEARTBEAT_S
from aggregator.extension.source import ExtensionSource
from aggregator.model.verdict import Phase
from tests.unit.test_extension import PATH, SETTINGS, listed, reconciler, world
from tests.unit.world import NS


@dataclass
class Judged:
    phase: Phase = Phase.HEALTHY
    judging: bool = True
    reason: str = "3/10 stale"
    view: str = ""
    view_opening: bool = False


def test_the_condition_says_when_protection_is_off_and_why() -> None:
    assert health(Judged(), "") == health(Judged(phase=Phase.CONFIRMING), "")
    assert health(Judged(), "").status == "True"
    down, restoring = health(Judged(phase=Phase.DOWN), ""), health(Judged(phase=Phase.RECOVERING), "")
    assert (down.status, down.reason) == ("True", "ControllersHeldDown")
    assert (restoring.status, restoring.reason) == ("True", "ControllersRestoring")
    # The verdict's changing words stay out: one write per phase, not per tick.
    assert down == health(Judged(phase=Phase.DOWN, reason="10/10 stale (100%) for 3.7s"), "")
    assert health(None, "").status == "Progressing"
    assert health(Judged(phase=Phase.STARTING), "").status == "Progressing"
    off = health(Judged(), "secret shoot-access-dwd-lease-aggregator: no token")
    assert (off.status, off.reason) == ("False", "ProtectionOff") and off.message.endswith("no token")
    blind = health(Judged(view="leases: watch failed 40s ago"), "")
    assert blind.status == "False" and "no trusted view" in blind.message
    opening = health(Judged(judging=False, view="not listed yet", view_opening=True), "")
    assert opening.status == "Progressing"
    few = health(Judged(judging=False, reason="2 candidates, fewer than 3"), "")
    assert few.status == "False" and few.message.endswith("2 candidates, fewer than 3")


def conditions(kube: object) -> list[dict[str, object]]:
    return list(kube.objects[PATH].get("status", {}).get("conditions") or [])  # type: ignore[attr-defined]


async def test_a_served_shoot_gets_its_condition_written_once_per_change() -> None:
    kube = world()
    source = ExtensionSource(kube, SETTINGS)
    said: list[tuple[Judged | None, str]] = [(None, "")]
    times = iter(f"2026-01-01T00:00:{s:02d}Z" for s in range(60))

    async def pass_() -> None:
        await listed(source)
        r = reconciler(kube, source, served={NS}, health_of=lambda ns: said[0])
        r.wall = lambda: next(times)
        await r.reconcile_all()

    await pass_()
    (first,) = conditions(kube)
    assert (first["type"], first["status"]) == ("SystemComponentsHealthy", "Progressing")
    writes = len(kube.writes)
    await pass_()
    assert len(kube.writes) == writes  # nothing new to say: nothing written
    said[0] = (Judged(), "")
    await pass_()
    (active,) = conditions(kube)
    assert active["status"] == "True" and active["lastTransitionTime"] == active["lastUpdateTime"]
    said[0] = (Judged(), "")
    await pass_()
    said[0] = (Judged(judging=False, reason="too few"), "")
    await pass_()
    (off,) = conditions(kube)
    assert off["status"] == "False" and off["lastTransitionTime"] != active["lastTransitionTime"]
    said[0] = (Judged(judging=False, reason="fewer still"), "")
    await pass_()
    (still,) = conditions(kube)
    assert still["message"] != off["message"] and still["lastTransitionTime"] == off["lastTransitionTime"]


async def test_a_shoot_not_served_gets_no_condition() -> None:
    kube = world()
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)
    await reconciler(kube, source, served=set(), health_of=lambda ns: (Judged(), "")).reconcile_all()
    assert conditions(kube) == []


async def test_the_heartbeat_is_renewed_every_interval_by_the_leader() -> None:
    kube = world()
    source = ExtensionSource(kube, SETTINGS)
    await listed(source)
    now = [100.0]
    r = reconciler(kube, source, heartbeat_ns="extension-dwd-lease", clock=lambda: now[0])
    path = LEASES.format(ns="extension-dwd-lease") + "/" + HEARTBEAT
    await r.beat()
    lease = kube.objects[path]
    assert (
        lease["spec"]["holderIdentity"] == "dwd-lease"
        and lease["spec"]["leaseDurationSeconds"] == HEARTBEAT_S
    )
    first = lease["spec"]["renewTime"]
    writes = len(kube.writes)
    now[0] += HEARTBEAT_S / 2
    await r.beat()
    assert len(kube.writes) == writes
    now[0] += HEARTBEAT_S
    await r.beat()
    assert kube.writes[-1][:2] == ("PATCH", path) and kube.objects[path]["spec"]["renewTime"] >= first
