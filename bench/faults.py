"""The fault suite: random cycles of outages and non-outages against real processes, with
leader kills, a failing seed and leader handovers thrown in, checked for the aggregator's two
failures that must never happen.

    python -m bench.faults [--cycles N] [--seed S]

Each cycle is one of
- outage: 60-100 % of the nodes stop renewing for 4-15 s (the controllers must go to 0);
- minority: fewer than 40 % stop renewing (nothing may be scaled down);
- kapi-restart: the shoot kube-apiserver is stopped (SIGTERM: it drains its watches first,
  which takes up to their 10 s), kept down 3-12 s and started again; the nodes stop
  renewing when the stop begins and renew again 1 s after /readyz, as behind a load
  balancer that admits traffic only to a ready server (nothing may be scaled down);
and any cycle may also get: SIGKILL of the leader (restarted 1-8 s later), the seed
answering 500 or 429 to every PATCH of a Deployment or its scale for 2-6 s, and a leader
handover (the leader's seed path blackholed for 4-8 s). The extras start anywhere from
the cut to 3 s after the heal, so they hit scale-ups as well as scale-downs.

After each cycle everything is healed and the rig must settle within 60 s: the
controllers at their replicas without a record, both replicas healthy, one leader.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType

from bench.faultrig import NODES, Rig, Sample, rig, wall
from bench.table import print_table
from testenv.standins import CONTROLLERS, json_log

KINDS = ("outage", "minority", "kapi-restart")
EXTRAS = ("kill", "seed-fault", "handover")
SETTLE_S = 60.0
# Past the aggregator's blind limit (2 min): a rig that has not settled by then never will.
LAST_CHANCE_S = 150.0
# The aggregator's writes of a dependent: its annotations, and its scale.
DEPLOYMENT_WRITES = r"/deployments/[^/]+(/scale)?$"
SHOWN_EVENTS = {
    "aggregator_started",
    "leader_changed",
    "target_leading",
    "target_observing",
    "view_fresh",
    "view_gap",
    "target_phase",
    "scale_down_blocked",
    "resource_scaling",
    "resource_scaled_down",
    "resource_scaled_up",
    "scale_step_failed",
}


@dataclass(frozen=True)
class Extra:
    what: str
    at_s: float  # after the cut (or the KAPI stop)
    for_s: float  # kill: until the restart; seed-fault and handover: how long
    status: int = 0  # seed-fault: what the seed answers


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
        extras = [
            f"+{e.what}{f'({e.status})' if e.status else ''}@{e.at_s:.1f}s/{e.for_s:.1f}s"
            for e in self.extras
        ]
        return " ".join([main, *extras])


def plan(rng: random.Random, n: int) -> Plan:
    kind = rng.choices(KINDS, weights=(4, 3, 3))[0]
    if kind == "outage":
        cut, duration = rng.randint(6, 10), rng.uniform(4, 15)
    elif kind == "minority":
        cut, duration = rng.randint(1, 3), rng.uniform(4, 10)
    else:
        cut, duration = 0, rng.uniform(3, 12)
    extras = []
    if rng.random() < 0.3:
        extras.append(Extra("kill", rng.uniform(0, duration + 3), rng.uniform(1, 8)))
    if rng.random() < 0.35:
        extras.append(
            Extra("seed-fault", rng.uniform(0, duration + 3), rng.uniform(2, 6), rng.choice((500, 429)))
        )
    if rng.random() < 0.3:
        extras.append(Extra("handover", rng.uniform(0, duration + 3), rng.uniform(4, 8)))
    return Plan(n, kind, duration, frozenset(rng.sample(NODES, cut)), tuple(extras))


@dataclass
class Result:
    plan: Plan
    start_wall: str
    end_wall: str = ""
    detect_s: float | None = None
    recover_s: float | None = None
    settle_s: float | None = None
    lowered: list[str] = field(default_factory=list)  # false scale-downs
    recorded: list[str] = field(default_factory=list)  # records written outside an outage
    left_at_zero: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)

    @property
    def defects(self) -> bool:
        return bool(self.lowered or self.left_at_zero or self.lost)


# -- the extras, each on its own thread next to the main fault


def _kill_leader(r: Rig, e: Extra, halt: threading.Event) -> None:
    if halt.wait(e.at_s):
        return
    leader = r.leader()
    if leader is None:
        r.journal("kill: no live leader to kill")
        return
    r.kill(leader)
    if not halt.wait(e.for_s):
        r.start(leader)


def _seed_fault(r: Rig, e: Extra, halt: threading.Event) -> None:
    if halt.wait(e.at_s):
        return
    for replica in r.replicas:
        replica.proxy.fail(
            e.status, method="PATCH", path=DEPLOYMENT_WRITES, retry_after=1 if e.status == 429 else None
        )
    r.journal(f"seed answers {e.status} to deployment PATCHes")
    try:
        halt.wait(e.for_s)
    finally:
        for replica in r.replicas:
            replica.proxy.clear()
        r.journal("seed fault window over")


def _handover(r: Rig, e: Extra, halt: threading.Event) -> None:
    if halt.wait(e.at_s):
        return
    leader = r.leader()
    if leader is None:
        r.journal("handover: no live leader to cut off")
        return
    leader.proxy.blackhole(True)
    r.journal(f"blackholed {leader.name}'s seed path")
    try:
        halt.wait(e.for_s)
    finally:
        leader.proxy.blackhole(False)
        r.journal(f"{leader.name}'s seed path back")


ACTIONS: dict[str, Callable[[Rig, Extra, threading.Event], None]] = {
    "kill": _kill_leader,
    "seed-fault": _seed_fault,
    "handover": _handover,
}


@contextlib.contextmanager
def extras(r: Rig, p: Plan) -> Iterator[Callable[[], None]]:
    """Starts the plan's extras now; yields a function that waits for them to end. Leaving
    early (Ctrl-C) cuts them short, each undoing what it did."""
    halt = threading.Event()
    threads = [
        threading.Thread(target=ACTIONS[e.what], args=(r, e, halt), name=e.what, daemon=True)
        for e in p.extras
    ]
    for t in threads:
        t.start()

    def finish() -> None:
        for t in threads:
            t.join()

    try:
        yield finish
    finally:
        halt.set()
        for t in threads:
            t.join(15)


# -- one cycle


def run_cycle(r: Rig, p: Plan) -> Result:
    mark = r.journal.mark()
    r.journal(f"cycle {p.n}: {p.describe()}")
    res = Result(p, wall())
    t_start = time.monotonic()
    with extras(r, p) as finish:
        t_cut = time.monotonic()
        if p.kind == "kapi-restart":
            # The load balancer admits nothing from the moment the server stops being ready.
            r.cut(frozenset(NODES))
            r.journal("stopping the shoot KAPI; no node renews")
            r.shoot.shoot.stop_apiserver()
            r.journal("shoot KAPI stopped")
            time.sleep(p.duration_s)
            r.shoot.shoot.start_apiserver()
            r.journal("shoot KAPI ready")
            time.sleep(1.0)
        else:
            r.cut(p.cut)
            r.journal(f"cut {sorted(p.cut)}")
            time.sleep(p.duration_s)
        r.restore_nodes()
        t_heal = time.monotonic()
        r.journal("nodes renew again")
        finish()
    r.heal()
    t_healed = time.monotonic()
    r.journal("everything healed")
    settled = _wait(r.settled, SETTLE_S)
    t_end = time.monotonic()
    res.settle_s = t_end - t_healed if settled else None
    _check(res, r.sampler.between(t_start, t_end), t_cut, t_heal)
    if not settled:
        res.notes.append(f"not settled {SETTLE_S:.0f}s after the heal: {r.describe()}")
        if _wait(r.settled, LAST_CHANCE_S):
            res.notes.append(f"settled {time.monotonic() - t_healed:.0f}s after the heal")
        else:
            res.notes.append(f"still not settled after {LAST_CHANCE_S:.0f}s more: {r.describe()}")
    res.end_wall = wall()
    r.journal(f"cycle {p.n} done")
    res.journal = r.journal.since(mark)
    return res


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _check(res: Result, samples: Sequence[Sample], t_cut: float, t_heal: float) -> None:
    if not samples:
        res.notes.append("no samples of the controllers")
        return
    down = dict.fromkeys(CONTROLLERS, 0)
    if res.plan.kind == "outage":
        first_down = next((s for s in samples if s.t >= t_cut and s.replicas == down), None)
        if first_down is not None:
            res.detect_s = first_down.t - t_cut
        if any(_below(s) for s in samples):
            back = next((s for s in samples if s.t >= t_heal and s.replicas == CONTROLLERS), None)
            if back is not None:
                res.recover_s = back.t - t_heal
    else:
        for name in CONTROLLERS:
            low = next((s for s in samples if s.replicas.get(name, 0) < CONTROLLERS[name]), None)
            if low is not None:
                res.lowered.append(f"{name} at {low.replicas.get(name)} at +{low.t - t_cut:.1f}s")
            marked = next((s for s in samples if name in s.annotated), None)
            if marked is not None:
                res.recorded.append(f"{name} at +{marked.t - t_cut:.1f}s")
    for name, want in CONTROLLERS.items():
        over = next((s for s in samples if s.replicas.get(name, 0) > want), None)
        if over is not None:
            res.lost.append(
                f"{name} restored to {over.replicas[name]}, not {want}, at +{over.t - t_cut:.1f}s"
            )
    last = samples[-1]
    for name, want in CONTROLLERS.items():
        got = last.replicas.get(name, 0)
        if got == 0:
            res.left_at_zero.append(f"{name} at 0 after the settle bound")
        elif got != want and not any(name in x for x in res.lost):
            res.lost.append(f"{name} at {got}, not {want}, after the settle bound")
        if name in last.annotated:
            res.lost.append(f"{name} still carries a record after the settle bound")


def _below(s: Sample) -> bool:
    return any(s.replicas.get(n, 0) < want for n, want in CONTROLLERS.items())


# -- the report


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):.1f} / {p90:.1f} / {ordered[-1]:.1f}"


def report(results: Sequence[Result], seed: int, runtime_s: float, workdir: Path, why_stopped: str) -> None:
    rows = []
    for kind in KINDS:
        of_kind = [x for x in results if x.plan.kind == kind]
        rows.append(
            [
                kind,
                len(of_kind),
                *[sum(1 for x in of_kind if any(e.what == w for e in x.plan.extras)) for w in EXTRAS],
            ]
        )
    rows.append(
        [
            "all",
            len(results),
            *[sum(1 for x in results if any(e.what == w for e in x.plan.extras)) for w in EXTRAS],
        ]
    )
    print_table(
        f"Fault suite: cycles by kind (seed {seed}, {runtime_s / 60:.1f} min{why_stopped})",
        ["kind", "cycles", "+ leader SIGKILL", "+ seed 500/429 on PATCH", "+ leader handover"],
        rows,
    )

    outages = [x for x in results if x.plan.kind == "outage"]
    clean = [x for x in outages if not x.plan.extras]
    mixed = [x for x in outages if x.plan.extras]
    print_table(
        "Fault suite: real outages, seconds (median / p90 / max)",
        ["outages", "count", "all 3 at 0", "cut -> all 3 at 0", "heal -> all back"],
        [
            [
                label,
                len(group),
                sum(1 for x in group if x.detect_s is not None),
                _stats([x.detect_s for x in group if x.detect_s is not None]),
                _stats([x.recover_s for x in group if x.recover_s is not None]),
            ]
            for label, group in (("no extras", clean), ("with extras", mixed), ("all", outages))
        ],
    )

    def count(attr: str) -> int:
        return sum(len(getattr(x, attr)) for x in results)

    def cycles(attr: str) -> str:
        return ", ".join(str(x.plan.n) for x in results if getattr(x, attr)) or "-"

    print_table(
        "Fault suite: defects (each a controller in a cycle; must all be 0)",
        ["defect", "count", "cycles"],
        [
            ["false scale-downs (replicas lowered, not an outage)", count("lowered"), cycles("lowered")],
            ["controllers left at 0 after heal", count("left_at_zero"), cycles("left_at_zero")],
            ["records lost (record left, or another count restored)", count("lost"), cycles("lost")],
            ["(not a defect) records written outside an outage", count("recorded"), cycles("recorded")],
            [
                "(not a defect) cycles not settled within 60 s",
                sum(1 for x in results if x.notes),
                cycles("notes"),
            ],
        ],
    )
    settle = [x.settle_s for x in results if x.settle_s is not None]
    print(
        f"\ncycles run: {len(results)} ("
        + ", ".join(f"{k} {sum(1 for x in results if x.plan.kind == k)}" for k in KINDS)
        + f"); false scale-downs: {count('lowered')}; left at 0: {count('left_at_zero')}; "
        f"records lost: {count('lost')}; heal -> settled {_stats(settle)} s; "
        f"runtime {runtime_s / 60:.1f} min"
    )
    print(f"logs (the suite's journal and each aggregator's JSON log): {workdir}")
    for x in results:
        if x.defects or x.notes:
            _explain(x, workdir)


def _explain(x: Result, workdir: Path) -> None:
    print(f"\n### cycle {x.plan.n}: {x.plan.describe()}")
    for what in (*x.lowered, *x.left_at_zero, *x.lost, *x.notes):
        print(f"- {what}")
    print("suite journal:")
    for line in x.journal:
        print(f"  {line}")
    start, end = datetime.fromisoformat(x.start_wall), datetime.fromisoformat(x.end_wall)
    for path in sorted(workdir.glob("aggregator-*.log")):
        lines = [
            e
            for e in json_log(path)
            if e.get("event") in SHOWN_EVENTS and start <= datetime.fromisoformat(e["timestamp"]) <= end
        ]
        if lines:
            print(f"{path.name}:")
            for e in lines:
                detail = {k: v for k, v in e.items() if k not in ("event", "timestamp", "level", "target")}
                print(f"  {e['timestamp']} {e['event']} {detail}")


# -- the suite


def _progress(x: Result, total: int) -> None:
    parts = [f"[{x.plan.n:3d}/{total}] {x.plan.describe()}"]
    if x.detect_s is not None:
        parts.append(f"down {x.detect_s:.1f}s")
    if x.recover_s is not None:
        parts.append(f"back {x.recover_s:.1f}s")
    parts.append(f"settled {x.settle_s:.1f}s" if x.settle_s is not None else "NOT SETTLED")
    if x.defects:
        parts.append("DEFECT")
    print(" | ".join(parts), flush=True)


def run(cycles: int = 50, seed: int = 1) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="dwd-faults-"))
    rng = random.Random(seed)
    results: list[Result] = []
    why_stopped = ""
    started = time.monotonic()
    print(f"fault suite: {cycles} cycles, seed {seed}; logs in {workdir}", flush=True)

    def terminate(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with rig(workdir) as r:
            for n in range(1, cycles + 1):
                x = run_cycle(r, plan(rng, n))
                results.append(x)
                _progress(x, cycles)
                if any(note.startswith("still not settled") for note in x.notes):
                    why_stopped = f", stopped after cycle {n}: the rig did not settle"
                    break
    except KeyboardInterrupt:
        why_stopped = f", interrupted after {len(results)} cycles"
    except Exception as e:
        why_stopped = f", aborted after {len(results)} cycles: {e!r}"
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        # Also when aborted: what the cycles so far found is the point of the run.
        report(results, seed, time.monotonic() - started, workdir, why_stopped)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=50, help="how many cycles (default 50)")
    parser.add_argument("--seed", type=int, default=1, help="the random plan's seed (default 1)")
    args = parser.parse_args()
    run(args.cycles, args.seed)


if __name__ == "__main__":
    main()
