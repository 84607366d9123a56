"""What the Extension tells gardenlet of a served shoot's protection (aggregator/extension/health.py)
and the heartbeat Lease, against the fake seed."""

from __future__ import annotations

from dataclasses import dataclass

from aggregator.extension.health import (
    DISABLED,
    HEARTBEAT,
    INVALID,
    LEASES,
    WAITING,
    Health,
    health,
    unserved,
)
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


# The condition contract (docs/design.md): each state of a shoot's protection, what the
# Extension says of it (None: nothing new, what was said stands), and what gardenlet's shoot care
# makes of that (tests/integration/test_gardenlet_checks.py asks its own code): "" where it
# leaves the Shoot's condition to its other checks. Only a broken protection of a shoot that
# needs one is False.
CONTRACT: list[tuple[str, Health | None, tuple[str, str] | None, str]] = [
    ("judging a quorum", health(Judged(), ""), ("True", "ProtectionActive"), ""),
    ("confirming a cut", health(Judged(phase=Phase.CONFIRMING), ""), ("True", "ProtectionActive"), ""),
    (
        "holding the controllers down",
        health(Judged(phase=Phase.DOWN), ""),
        ("True", "ControllersHeldDown"),
        "",
    ),
    ("restoring them", health(Judged(phase=Phase.RECOVERING), ""), ("True", "ControllersRestoring"), ""),
    (
        "too few candidates (a 1-node shoot)",
        health(Judged(judging=False, reason="no verdict: 1 candidate(s), fewer than 3"), ""),
        ("True", "QuorumNotJudged"),
        "",
    ),
    ("in dry run", health(Judged(phase=Phase.DOWN), "", dry_run=True), ("True", "DryRun"), ""),
    ("opted out", unserved("", DISABLED), ("True", "ProtectionDisabled"), ""),
    ("hibernated", unserved("hibernated", ""), ("True", "ShootHibernated"), ""),
    ("no workers", unserved("worker-less", ""), ("True", "NoWorkers"), ""),
    ("starting (no target yet)", health(None, ""), None, ""),
    ("reading the scale-down record", health(Judged(phase=Phase.STARTING), ""), None, ""),
    ("the view waiting out a lease", health(Judged(view="opening", view_opening=True), ""), None, ""),
    ("waking up", unserved("waking up", ""), None, ""),
    ("waiting for its state", unserved("", WAITING), None, ""),
    (
        "no trusted view of the shoot",
        health(Judged(view="leases: watch failed 40s ago"), ""),
        ("False", "ProtectionOff"),
        "False",
    ),
    ("its target failed", health(Judged(), "no token for the shoot"), ("False", "ProtectionOff"), "False"),
    (
        "a providerConfig never valid",
        unserved("", f"{INVALID}: providerConfig.failureFraction: 1.5 is not a fraction in (0, 1]"),
        ("False", "ConfigurationInvalid"),
        "False",
    ),
]


def test_the_condition_contract() -> None:
    for state, said, expected, _ in CONTRACT:
        got = None if said is None else (said.status, said.reason)
        assert got == expected, state
        print(f"{state}: {'(nothing new)' if said is None else f'{said.status} {said.reason}'}")


def test_the_condition_says_when_protection_is_off_and_why() -> None:
    active = health(Judged(), "")
    assert active == health(Judged(phase=Phase.CONFIRMING), "")
    assert active is not None and active.status == "True"
    down, restoring = health(Judged(phase=Phase.DOWN), ""), health(Judged(phase=Phase.RECOVERING), "")
    assert down is not None and restoring is not None
    assert (down.status, down.reason) == ("True", "ControllersHeldDown")
    assert (restoring.status, restoring.reason) == ("True", "ControllersRestoring")
    # The verdict's changing words stay out: one write per phase, not per tick.
    assert down == health(Judged(phase=Phase.DOWN, reason="10/10 stale (100%) for 3.7s"), "")
    # Starting to judge says nothing new: what was said stands.
    assert health(None, "") is None and health(Judged(phase=Phase.STARTING), "") is None
    assert health(Judged(judging=False, view="not listed yet", view_opening=True), "") is None
    off = health(Judged(), "secret shoot-access-dwd-lease-aggregator: no token")
    assert off is not None and (off.status, off.reason) == ("False", "ProtectionOff")
    assert off.message.endswith("no token")
    blind = health(Judged(view="leases: watch failed 40s ago"), "")
    assert blind is not None and blind.status == "False" and "no trusted view" in blind.message
    # Too few to judge is no broken protection: True, and why.
    few = health(Judged(judging=False, reason="2 candidates, fewer than 3"), "")
    assert few is not None and (few.status, few.reason) == ("True", "QuorumNotJudged")
    assert few.message.endswith("2 candidates, fewer than 3")


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
    assert conditions(kube) == []  # starting: nothing to say yet
    said[0] = (Judged(), "")
    await pass_()
    (active,) = conditions(kube)
    assert active["status"] == "True" and active["lastTransitionTime"] == active["lastUpdateTime"]
    writes = len(kube.writes)
    await pass_()
    assert len(kube.writes) == writes  # nothing new to say: nothing written
    said[0] = (Judged(judging=False, reason="too few"), "")
    await pass_()
    (few,) = conditions(kube)
    assert few["status"] == "True" and few["lastTransitionTime"] == active["lastTransitionTime"]
    said[0] = (Judged(view="leases: watch failed 40s ago"), "")
    await pass_()
    (off,) = conditions(kube)
    assert off["status"] == "False" and off["lastTransitionTime"] != active["lastTransitionTime"]
    said[0] = (Judged(view="leases: watch failed 80s ago"), "")
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
