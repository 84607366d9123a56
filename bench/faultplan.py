"""The fault suite's random plan, and the extra faults that run next to a cycle's main fault.

The extras start when the aggregator is likely to be writing: 1-4.5 s after the
cut (the scale-down, in an outage) or 0-3 s after the heal (the scale-up). At a
random moment most of them would fall where nothing is being written, and a
seed that fails no write tests nothing.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bench.faultrig import NODES, Rig

KINDS = ("outage", "minority", "kapi-restart")
EXTRAS = ("kill", "seed-fault", "handover")
# The aggregator's writes of a dependent: its annotations, and its scale.
DEPLOYMENT_WRITES = r"/deployments/[^/]+(/scale)?$"


@dataclass(frozen=True)
class Extra:
    what: str
    after_heal: bool  # counted from the heal, else from the cut
    at_s: float
    for_s: float  # kill: until the restart; seed-fault and handover: how long
    status: int = 0  # seed-fault: what the seed answers

    def describe(self) -> str:
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


def plan(rng: random.Random, n: int) -> Plan:
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
    if rng.random() < 0.3:
        extras.append(extra("kill", rng.uniform(1, 8)))
    if rng.random() < 0.35:
        extras.append(extra("seed-fault", rng.uniform(2, 6), rng.choice((500, 429))))
    if rng.random() < 0.3:
        extras.append(extra("handover", rng.uniform(4, 8)))
    return Plan(n, kind, duration, frozenset(rng.sample(NODES, cut)), tuple(extras))


@dataclass
class Tally:
    """What the extras did: a kill or a handover may find no leader, a fault window no write."""

    kills: int = 0
    handovers: int = 0  # the lease moved while the leader's seed path was blackholed
    refused: int = 0  # Deployment PATCHes the seed refused


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


ACTIONS: dict[str, Callable[[Rig, Extra, Moments, Tally], None]] = {
    "kill": _kill_leader,
    "seed-fault": _seed_fault,
    "handover": _handover,
}


@contextlib.contextmanager
def running(r: Rig, p: Plan, tally: Tally) -> Iterator[tuple[threading.Event, Callable[[], None]]]:
    """Starts the plan's extras; yields the event to set at the heal and a function that waits
    for them to end. Leaving early (Ctrl-C) cuts them short, each undoing what it did."""
    m = Moments(threading.Event(), threading.Event())
    threads = [
        threading.Thread(target=ACTIONS[e.what], args=(r, e, m, tally), name=e.what, daemon=True)
        for e in p.extras
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
