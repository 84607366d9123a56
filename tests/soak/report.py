"""What one cycle of the fault suite found, and the tables for all of them.

The defects come from the sampler alone (what reached the seed); the
aggregators' logs only explain them, and say how often an interlock had to
refuse a scale-down or another writer raised a controller held down.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.tools.table import print_table
from testenv.base.process import json_log
from testenv.kube.controllers import CONTROLLERS
from testenv.worlds.shoot_world import Sample
from tests.soak.plan import EXTRAS, KINDS, Plan, Tally
from tests.soak.rig import annotated, recorded

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
    "dependent_raised_by_someone_else",
}
# The defects, each a list on Result (one entry per controller in a cycle): all must stay empty.
DEFECTS = {
    "lowered": "false scale-downs (replicas lowered, not an outage)",
    "left_at_zero": "controllers left at 0 after heal",
    "lost": "records lost (record left, or restored to neither its count nor the operator's)",
    "lowered_again": "controllers lowered again during the scale-up",
}
EXTRA_HEADERS = {
    "kill": "+ leader SIGKILL",
    "seed-fault": "+ seed 500/429 on PATCH",
    "handover": "+ leader handover",
    "dwd": "+ dependency-watchdog",
    "operator-scale": "+ operator scale",
    "window-kill": "+ SIGKILL in scale-up window",
}


@dataclass
class Result:
    plan: Plan
    start_wall: str
    end_wall: str = ""
    tally: Tally = field(default_factory=Tally)
    detect_s: float | None = None
    recover_s: float | None = None
    settle_s: float | None = None
    lowered: list[str] = field(default_factory=list)  # false scale-downs
    recorded: list[str] = field(default_factory=list)  # records written outside an outage
    left_at_zero: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    lowered_again: list[str] = field(default_factory=list)  # lowered once back after the heal
    held_after_heal: list[str] = field(default_factory=list)  # lowered after the heal, still held
    notes: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)

    @property
    def defects(self) -> bool:
        return any(getattr(self, attr) for attr in DEFECTS)

    def holds(self, when: datetime) -> bool:
        return datetime.fromisoformat(self.start_wall) <= when <= datetime.fromisoformat(self.end_wall)


def check(
    res: Result, samples: Sequence[Sample], t_cut: float, t_heal: float, t_reset: float = math.inf
) -> None:
    """Judges a cycle from the samples between its start and the end of its settling.

    ``t_reset``: when the suite set an operator's count back to the configured one; until
    then the operator's count is what must come back, from then on the configured one."""
    if not samples:
        res.notes.append("no samples of the controllers")
        return
    want = res.tally.expected()
    if res.plan.kind == "outage":
        down = dict.fromkeys(CONTROLLERS, 0)
        first_down = next((s for s in samples if s.t >= t_cut and s.replicas == down), None)
        if first_down is not None:
            res.detect_s = first_down.t - t_cut
        if any(_below(s) for s in samples):
            res.recover_s = _back_for_good(samples, t_heal, t_reset, want)
        again = _lowered_again(samples, t_cut, t_heal, t_reset)
        res.lowered_again.extend(again.values())
        held = _lowered_after_heal(samples, t_heal, t_reset)
        res.held_after_heal.extend(why for name, why in held.items() if name not in again)
    else:
        for name, count in CONTROLLERS.items():
            low = next((s for s in samples if s.replicas.get(name, 0) < count), None)
            if low is not None:
                res.lowered.append(f"{name} at {low.replicas.get(name)} at cut+{low.t - t_cut:.1f}s")
            marked = next((s for s in samples if name in annotated(s)), None)
            if marked is not None:
                res.recorded.append(f"{name} at cut+{marked.t - t_cut:.1f}s")
    res.lost.extend(_restored_wrong(samples, t_heal, t_reset, want))
    last = samples[-1]
    for name, count in CONTROLLERS.items():
        # Above both the configured count and the operator's: nobody asked for that.
        ceiling = max(count, want[name])
        over = next((s for s in samples if s.replicas.get(name, 0) > ceiling), None)
        got = last.replicas.get(name, 0)
        if over is not None:
            res.lost.append(f"{name} at {over.replicas[name]}, not {ceiling}, at cut+{over.t - t_cut:.1f}s")
        elif got not in (0, count):
            res.lost.append(f"{name} at {got}, not {count}, after the settle bound")
        if got == 0:
            res.left_at_zero.append(f"{name} at 0 after the settle bound")
        if name in annotated(last):
            res.lost.append(f"{name} still carries a record after the settle bound")


def _restored_wrong(
    samples: Sequence[Sample], t_heal: float, t_reset: float, want: dict[str, int]
) -> list[str]:
    """The first sample after the heal with all three running and none held by our record
    (the scale-up done) must show the counts taken away, or the operator's. Earlier samples
    may show dependency-watchdog's raise while still held; a controller never back is
    "left at 0"."""
    back = next(
        (
            s
            for s in samples
            if t_heal <= s.t < t_reset and not recorded(s) and all(s.replicas.get(n, 0) > 0 for n in want)
        ),
        None,
    )
    if back is None:
        return []
    return [
        f"{name} restored to {back.replicas.get(name)}, not {count}, at heal+{back.t - t_heal:.1f}s"
        for name, count in want.items()
        if back.replicas.get(name) != count
    ]


def _back_for_good(
    samples: Sequence[Sample], t_heal: float, t_reset: float, want: dict[str, int]
) -> float | None:
    """Seconds from the heal to the sample from which on all three stay at ``want``: a
    controller dependency-watchdog raised while held may be up at the heal and lowered
    after it, and is not back until the aggregator's scale-up."""
    after = [s for s in samples if t_heal <= s.t < t_reset]
    short = [i for i, s in enumerate(after) if s.replicas != want]
    first = short[-1] + 1 if short else 0
    return after[first].t - t_heal if first < len(after) else None


def _lowered_again(samples: Sequence[Sample], t_cut: float, t_heal: float, t_reset: float) -> dict[str, str]:
    """Once a controller lowered in the outage is back after the heal without our record
    (the aggregator's scale-up of it done), nothing may lower it again in the cycle (up to
    the operator's own reset): a restart or a takeover in the scale-up holds what it finds.

    "Back" is not "above 0": dependency-watchdog may raise it while the aggregator still
    holds it down (the record then stays), and a scale-down still under way at the heal
    may lower it after the heal: neither is a scale-up (``_lowered_after_heal``)."""
    found = {}
    for name in CONTROLLERS:
        lowered_at = next((s.t for s in samples if s.t >= t_cut and s.replicas.get(name, 0) == 0), None)
        if lowered_at is None:
            continue
        back = next(
            (
                s
                for s in samples
                if max(t_heal, lowered_at) <= s.t < t_reset
                and s.replicas.get(name, 0) > 0
                and name not in recorded(s)
            ),
            None,
        )
        if back is None:
            continue
        low = next(
            (s for s in samples if back.t < s.t < t_reset and s.replicas.get(name, 0) < back.replicas[name]),
            None,
        )
        if low is not None:
            found[name] = (
                f"{name} back at {back.replicas[name]} at heal+{back.t - t_heal:.1f}s, "
                f"then at {low.replicas.get(name)} at heal+{low.t - t_heal:.1f}s"
            )
    return found


def _lowered_after_heal(samples: Sequence[Sample], t_heal: float, t_reset: float) -> dict[str, str]:
    """Controllers lower in a sample after the heal than in an earlier one: the aggregator
    holds them down until the recovery period has passed, so a scale-down under way at the
    heal goes on, and what dependency-watchdog raised in the outage is lowered again. No
    defect, but each is one more restart of that controller than the outage needed."""
    found = {}
    after = [s for s in samples if t_heal <= s.t < t_reset]
    for name in CONTROLLERS:
        high = None
        for s in after:
            got = s.replicas.get(name, 0)
            if high is not None and got < high.replicas.get(name, 0):
                found[name] = (
                    f"{name} at {high.replicas.get(name)} at heal+{high.t - t_heal:.1f}s, "
                    f"lowered to {got} at heal+{s.t - t_heal:.1f}s"
                )
                break
            if high is None or got > high.replicas.get(name, 0):
                high = s
    return found


def _below(s: Sample) -> bool:
    return any(s.replicas.get(n, 0) < want for n, want in CONTROLLERS.items())


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):.1f} / {p90:.1f} / {ordered[-1]:.1f}"


@dataclass(frozen=True)
class LogEvent:
    when: datetime
    log: str
    fields: dict[str, Any]


def log_events(workdir: Path) -> list[LogEvent]:
    return [
        LogEvent(datetime.fromisoformat(e["timestamp"]), path.stem, e)
        for path in sorted(workdir.glob("aggregator-*.log"))
        for e in json_log(path)
        if e.get("event") in SHOWN_EVENTS
    ]


def report(results: Sequence[Result], seed: int, runtime_s: float, workdir: Path, why_stopped: str) -> None:
    _kinds(results, seed, runtime_s, why_stopped)
    _outages(results)
    events = log_events(workdir)
    _coverage(results, events)
    _defects(results)
    settle = [x.settle_s for x in results if x.settle_s is not None]
    print(
        f"\ncycles run: {len(results)} ("
        + ", ".join(f"{k} {sum(1 for x in results if x.plan.kind == k)}" for k in KINDS)
        + f"); false scale-downs: {_count(results, 'lowered')}; "
        f"left at 0: {_count(results, 'left_at_zero')}; records lost: {_count(results, 'lost')}; "
        f"lowered again during the scale-up: {_count(results, 'lowered_again')}; "
        f"heal -> settled {_stats(settle)} s; runtime {runtime_s / 60:.1f} min"
    )
    print(f"logs (the suite's journal, faults.log, and each aggregator's JSON log): {workdir}")
    for x in results:
        if x.defects or x.notes:
            _explain(x, events)


def _kinds(results: Sequence[Result], seed: int, runtime_s: float, why_stopped: str) -> None:
    def row(label: str, group: Sequence[Result]) -> list[object]:
        return [label, len(group), *[sum(1 for x in group if x.plan.has(w)) for w in EXTRAS]]

    print_table(
        f"Fault suite: cycles by kind (seed {seed}, {runtime_s / 60:.1f} min{why_stopped})",
        ["kind", "cycles", *[EXTRA_HEADERS[w] for w in EXTRAS]],
        [
            *[row(k, [x for x in results if x.plan.kind == k]) for k in KINDS],
            row("all", results),
        ],
    )


def _outages(results: Sequence[Result]) -> None:
    outages = [x for x in results if x.plan.kind == "outage"]
    groups = (
        ("no extras", [x for x in outages if not x.plan.extras]),
        ("with extras", [x for x in outages if x.plan.extras]),
        ("all", outages),
    )
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
            for label, group in groups
        ],
    )


def _coverage(results: Sequence[Result], events: Sequence[LogEvent]) -> None:
    def during(kind: str, event: str, **match: str) -> int:
        return sum(
            1
            for e in events
            if e.fields.get("event") == event
            and all(e.fields.get(k) == v for k, v in match.items())
            and any(x.plan.kind == kind and x.holds(e.when) for x in results)
        )

    def total(attr: str) -> list[int]:
        return [sum(getattr(x.tally, attr) for x in results if x.plan.kind == k) for k in KINDS]

    print_table(
        "Fault suite: what the faults did",
        ["what", "outage", "minority", "kapi-restart"],
        [
            ["replicas SIGKILLed (the leader; both in a window rollout)", *total("kills")],
            ["replicas SIGKILLed in the scale-up window (KCM up, MCM at 0)", *total("window_kills")],
            ["handovers (the lease moved while the leader was blackholed)", *total("handovers")],
            ["Deployment PATCHes the seed refused", *total("refused")],
            ["dependency-watchdog raised a held-down controller", *total("dwd_raises")],
            [
                "operator scaled a held-down controller",
                *[sum(1 for x in results if x.plan.kind == k and x.tally.operator) for k in KINDS],
            ],
            [
                "raises by someone else reported (any replica)",
                *[during(k, "dependent_raised_by_someone_else") for k in KINDS],
            ],
            ["scale-downs an interlock refused (leader)", *[during(k, "scale_down_blocked") for k in KINDS]],
            [
                "'scaled-down' verdicts (any replica, standbys included)",
                *[during(k, "target_phase", phase="scaled-down") for k in KINDS],
            ],
        ],
    )


def _count(results: Sequence[Result], attr: str) -> int:
    return sum(len(getattr(x, attr)) for x in results)


def defects(results: Sequence[Result]) -> dict[str, int]:
    """How many of each defect the cycles found, by its DEFECTS label."""
    return {label: _count(results, attr) for attr, label in DEFECTS.items()}


def _defects(results: Sequence[Result]) -> None:
    def cycles(attr: str) -> str:
        return ", ".join(str(x.plan.n) for x in results if getattr(x, attr)) or "-"

    print_table(
        "Fault suite: defects (each a controller in a cycle; must all be 0)",
        ["defect", "count", "cycles"],
        [
            *[[label, _count(results, attr), cycles(attr)] for attr, label in DEFECTS.items()],
            [
                "(not a defect) controllers lowered after the heal, still held (recovery period)",
                _count(results, "held_after_heal"),
                cycles("held_after_heal"),
            ],
            [
                "(not a defect) records written outside an outage",
                _count(results, "recorded"),
                cycles("recorded"),
            ],
            [
                "(not a defect) cycles not settled within 60 s",
                sum(1 for x in results if x.notes),
                cycles("notes"),
            ],
        ],
    )


def _explain(x: Result, events: Sequence[LogEvent]) -> None:
    print(f"\n### cycle {x.plan.n}: {x.plan.describe()}")
    for what in (*x.lowered, *x.left_at_zero, *x.lost, *x.lowered_again, *x.notes):
        print(f"- {what}")
    print("suite journal:")
    for line in x.journal:
        print(f"  {line}")
    print("aggregator logs:")
    for e in sorted((e for e in events if x.holds(e.when)), key=lambda e: e.when):
        detail = {k: v for k, v in e.fields.items() if k not in ("event", "timestamp", "level", "target")}
        print(f"  {e.fields['timestamp']} {e.log} {e.fields['event']} {detail}")
