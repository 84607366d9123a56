"""The fault suite's random plan, and the extra faults that run next to a cycle's main fault.

The extras start when the aggregator is likely to be writing: 1-4.5 s after the
cut (the scale-down, in an outage) or 0-3 s after the heal (the scale-up). At a
random moment most of them would fall where nothing is being written, and a
seed that fails no write tests nothing. Three wait for a state instead of a
moment, because the state is the point:
- dwd: dependency-watchdog's prober runs through the whole cycle; its verdict is
  always "scale-up" (the suite's outages are far shorter than its 30 s), so it
  raises whatever the aggregator holds at 0, and the aggregator must lower it again;
- operator-scale (outages only): once all three controllers are at 0, an operator
  scales one of them to another count; that count is what must come back;
- window-kill (outages only): once KCM is back after the heal and MCM still at 0
  with our record, the leader (or both replicas: a rollout) is SIGKILLed; the new
  leader must not lower KCM again.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from testenv.gardener.prober_standin import ProberStandIn
from testenv.kube.controllers import CONTROLLERS, KCM, MCM
from tests.soak.rig import NODES, Rig, recorded

KINDS = ("outage", "minority", "kapi-restart")
EXTRAS = ("kill", "seed-fault", "handover", "dwd", "operator-scale", "window-kill")
# The chance of each extra in a cycle (operator-scale and window-kill: in an outage): over
# 50 cycles (about 20 outages) each of the last three comes up 10 times or more. Window-kill
# more often: beside dependency-watchdog its window is often closed before it opens (DWD
# raises MCM from 0 as soon as its own delay after KCM has passed), and the kill is skipped.
CHANCES = {
    "kill": 0.3,
    "seed-fault": 0.35,
    "handover": 0.3,
    "dwd": 0.4,
    "operator-scale": 0.6,
    "window-kill": 0.75,
}
# How long after the heal window-kill waits for its window (MCM's 5 s delay, a restart or a
# takeover before it): past it, it is skipped.
WINDOW_WAIT_S = 30.0
# The aggregator's writes of a dependent: its annotations, and its scale.
DEPLOYMENT_WRITES = r"/deployments/[^/]+(/scale)?$"


@dataclass(frozen=True)
class Extra:
    what: str
    after_heal: bool  # counted from the heal, else from the cut
    at_s: float
    for_s: float  # kill and window-kill: until the restart; seed-fault and handover: how long
    status: int = 0  # seed-fault: what the seed answers
    scale: tuple[str, int] = ("", 0)  # operator-scale: which controller, to how many
    both: bool = False  # window-kill: both replicas (a rollout), not only the leader

    def describe(self) -> str:
        if self.what == "dwd":
            return "+dwd"
        if self.what == "operator-scale":
            return f"+operator-scale({self.scale[0]}={self.scale[1]})@all-down"
        if self.what == "window-kill":
            return f"+window-kill({'both' if self.both else 'leader'})@window/{self.for_s:.1f}s"
        status = f"({self.status})" if self.status else ""
        return (
            f"+{self.what}{status}@{'heal' if self.after_heal else 'cut'}+{self.at_s:.1f}s/{self.for_s:.1f}s"
        )


@dataclass(frozen=True)
class Plan:
    n: int
    kind: str
    duration_s: float
    cut: frozenset[str]
    extras: tuple[Extra, ...]

    def describe(self) -> str:
        main = {
            "outage": f"outage {len(self.cut)}/{len(NODES)} for {self.duration_s:.1f}s",
            "minority": f"minority {len(self.cut)}/{len(NODES)} for {self.duration_s:.1f}s",
            "kapi-restart": f"kapi-restart down {self.duration_s:.1f}s",
        }[self.kind]
        return " ".join([main, *(e.describe() for e in self.extras)])

    def has(self, what: str) -> bool:
        return any(e.what == what for e in self.extras)


def draw(rng: random.Random, n: int) -> Plan:
    """Cycle ``n``'s plan, drawn from ``rng``: the same seed, the same cycles."""
    kind = rng.choices(KINDS, weights=(4, 3, 3))[0]
    if kind == "outage":
        cut, duration = rng.randint(6, 10), rng.uniform(4, 15)
    elif kind == "minority":
        cut, duration = rng.randint(1, 3), rng.uniform(4, 10)
    else:
        cut, duration = 0, rng.uniform(3, 12)

    def extra(what: str, for_s: float, status: int = 0) -> Extra:
        after_heal = rng.random() < 0.5
        at_s = rng.uniform(0, 3) if after_heal else rng.uniform(1, 4.5)
        return Extra(what, after_heal, at_s, for_s, status)

    extras = []
    if rng.random() < CHANCES["kill"]:
        extras.append(extra("kill", rng.uniform(1, 8)))
    if rng.random() < CHANCES["seed-fault"]:
        extras.append(extra("seed-fault", rng.uniform(2, 6), rng.choice((500, 429))))
    if rng.random() < CHANCES["handover"]:
        extras.append(extra("handover", rng.uniform(4, 8)))
    if rng.random() < CHANCES["dwd"]:
        extras.append(Extra("dwd", False, 0.0, 0.0))
    # Drawn in every cycle, so that the kind does not shift the draws of the cycles after it.
    operator, window = rng.random() < CHANCES["operator-scale"], rng.random() < CHANCES["window-kill"]
    name = rng.choice(sorted(CONTROLLERS))
    count = rng.choice([c for c in range(1, 6) if c != CONTROLLERS[name]])
    restart_s, both = rng.uniform(1, 3), rng.random() < 0.5
    if kind == "outage" and operator:
        extras.append(Extra("operator-scale", False, 0.0, 0.0, scale=(name, count)))
    if kind == "outage" and window:
        extras.append(Extra("window-kill", True, 0.0, restart_s, both=both))
    return Plan(n, kind, duration, frozenset(rng.sample(NODES, cut)), tuple(extras))


@dataclass
class Tally:
    """What the extras did: a kill or a handover may find no leader, a fault window no write."""

    kills: int = 0
    handovers: int = 0  # the lease moved while the leader's seed path was blackholed
    refused: int = 0  # Deployment PATCHes the seed refused
    dwd_raises: int = 0  # dependency-watchdog's scale writes above 0 (it raises only from 0)
    operator: tuple[str, int] | None = None  # the operator's scale while held down, if it came
    window_kills: int = 0  # replicas SIGKILLed with KCM back and MCM at 0

    def expected(self) -> dict[str, int]:
        """The counts that must come back after the heal: the ones taken away, or the
        operator's where an operator scaled while they were held down."""
        if self.operator is None:
            return dict(CONTROLLERS)
        name, replicas = self.operator
        return {**CONTROLLERS, name: replicas}


@dataclass
class Moments:
    healed: threading.Event
    halt: threading.Event

    def reach(self, e: Extra) -> bool:
        """Waits for the extra's moment; False when the cycle is cut short first."""
        while e.after_heal and not self.healed.wait(0.1):
            if self.halt.is_set():
                return False
        return not self.halt.wait(e.at_s)


def _kill_leader(r: Rig, e: Extra, m: Moments, tally: Tally) -> None:
    if not m.reach(e):
        return
    leader = r.leader()
    if leader is None:
        r.journal("kill: no live leader to kill")
        return
    r.kill(leader)
    tally.kills += 1
    if not m.halt.wait(e.for_s):
        r.start(leader)


def _seed_fault(r: Rig, e: Extra, m: Moments, tally: Tally) -> None:
    if not m.reach(e):
        return
    retry_after = 1 if e.status == 429 else None
    rules = [
        replica.proxy.fail(e.status, method="PATCH", path=DEPLOYMENT_WRITES, retry_after=retry_after)
        for replica in r.replicas
    ]
    r.journal(f"seed answers {e.status} to deployment PATCHes")
    try:
        m.halt.wait(e.for_s)
    finally:
        for replica in r.replicas:
            replica.proxy.clear()
        tally.refused += sum(rule.hits for rule in rules)
        r.journal(f"seed fault window over: {sum(rule.hits for rule in rules)} PATCHes refused")


def _handover(r: Rig, e: Extra, m: Moments, tally: Tally) -> None:
    if not m.reach(e):
        return
    leader = r.leader()
    if leader is None:
        r.journal("handover: no live leader to cut off")
        return
    leader.proxy.blackhole(True)
    r.journal(f"blackholed {leader.name}'s seed path")
    try:
        m.halt.wait(e.for_s)
    finally:
        now = r.leader()
        if now is not None and now is not leader:
            tally.handovers += 1
        leader.proxy.blackhole(False)
        r.journal(f"{leader.name}'s seed path back; leader: {now.name if now else 'none'}")


def _operator_scale(r: Rig, e: Extra, m: Moments, tally: Tally) -> None:
    """Once all three are at 0 and before the heal: only then is it a scale while held down."""
    down = dict.fromkeys(CONTROLLERS, 0)
    while not m.healed.is_set():
        if _seen(r, lambda replicas, _recorded: replicas == down):
            # Noted first: the check must expect the operator's count even if the write is slow.
            tally.operator = e.scale
            r.scale(*e.scale, "operator, while held down")
            return
        if m.halt.wait(0.05):
            return
    r.journal("operator-scale: the controllers were not all at 0 before the heal")


def _window_kill(r: Rig, e: Extra, m: Moments, tally: Tally) -> None:
    """In the scale-up's window: KCM back (its record gone: the aggregator's scale-up, not
    dependency-watchdog's raise while held), MCM still at 0 with our record."""
    if not m.reach(e):
        return
    deadline = time.monotonic() + WINDOW_WAIT_S
    while not _seen(r, _in_window):
        if time.monotonic() > deadline or m.halt.wait(0.05):
            r.journal(f"window-kill: no window (KCM back, MCM at 0) within {WINDOW_WAIT_S:.0f}s of the heal")
            return
    leader = r.leader()
    victims = [v for v in r.replicas if v.alive()] if e.both else [leader] if leader is not None else []
    if not victims:
        r.journal("window-kill: no live leader to kill")
        return
    r.journal(f"window-kill: KCM back, MCM at 0; killing {'both replicas' if e.both else 'the leader'}")
    for v in victims:
        r.kill(v)
    tally.kills += len(victims)
    tally.window_kills += len(victims)
    if not m.halt.wait(e.for_s):
        for v in victims:
            r.start(v)


def _in_window(replicas: dict[str, int], recorded: frozenset[str]) -> bool:
    return replicas.get(KCM, 0) > 0 and KCM not in recorded and replicas.get(MCM) == 0 and MCM in recorded


def _seen(r: Rig, state: Callable[[dict[str, int], frozenset[str]], bool]) -> bool:
    sample = r.sampler.latest()
    return sample is not None and state(sample.replicas, recorded(sample))


ACTIONS: dict[str, Callable[[Rig, Extra, Moments, Tally], None]] = {
    "kill": _kill_leader,
    "seed-fault": _seed_fault,
    "handover": _handover,
    "operator-scale": _operator_scale,
    "window-kill": _window_kill,
}


@contextlib.contextmanager
def watchdog(r: Rig, p: Plan, tally: Tally) -> Iterator[None]:
    """dependency-watchdog beside the aggregators for the whole cycle, its settling included,
    when the plan has it; counts its raises when it stops."""
    if not p.has("dwd"):
        yield
        return
    with r.watchdog() as dwd:
        yield
    tally.dwd_raises = _journal_raises(r, dwd)  # stopped: no write is still under way


def _journal_raises(r: Rig, dwd: ProberStandIn) -> int:
    raises = [w for w in dwd.writes if w.method == "PUT" and w.body["spec"]["replicas"] > 0]
    for w in raises:
        r.journal(f"dependency-watchdog raised {w.name} to {w.body['spec']['replicas']}", at=w.t)
    return len(raises)


@contextlib.contextmanager
def running(r: Rig, p: Plan, tally: Tally) -> Iterator[tuple[threading.Event, Callable[[], None]]]:
    """Starts the plan's extras; yields the event to set at the heal and a function that waits
    for them to end. Leaving early (Ctrl-C) cuts them short, each undoing what it did."""
    m = Moments(threading.Event(), threading.Event())
    threads = [
        threading.Thread(target=ACTIONS[e.what], args=(r, e, m, tally), name=e.what, daemon=True)
        for e in p.extras
        if e.what in ACTIONS
    ]
    for t in threads:
        t.start()

    def finish() -> None:
        for t in threads:
            t.join()

    try:
        yield m.healed, finish
    finally:
        m.halt.set()
        for t in threads:
            t.join(15)
