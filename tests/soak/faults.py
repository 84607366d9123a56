"""The fault suite: random cycles of outages and non-outages against real processes, with
leader kills, a failing seed and leader handovers thrown in, checked for the aggregator's
failures that must never happen.

    python -m tests.soak.faults [--cycles N] [--seed S]

prints its report and exits 1 on any defect; ``make soak`` runs 50 cycles,
``make test`` a short slice of a fixed seed (tests/soak/test_faults.py).

Each cycle is one of
- outage: 60-100 % of the nodes stop renewing for 4-15 s (the controllers must go to 0);
- minority: fewer than 40 % stop renewing for 4-10 s (nothing may be scaled down);
- kapi-restart: the shoot kube-apiserver is stopped (SIGTERM: it drains its watches first,
  which takes up to their 10 s), kept down 3-12 s and started again; the nodes stop
  renewing when the stop begins and renew again 1 s after it serves (/livez) again: the
  aggregators reach it directly, so the nodes' load balancer follows the same signal
  (nothing may be scaled down);
and any cycle may also get: SIGKILL of the leader (restarted 1-8 s later), the seed
answering 500 or 429 to every PATCH of a Deployment or its scale for 2-6 s, a leader
handover (the leader's seed path blackholed for 4-8 s), and dependency-watchdog's prober
running beside the aggregators (it raises whatever they hold at 0: they must lower it
again); an outage may also get an operator scaling one controller held at 0 to another
count (that count must come back), and a SIGKILL of the leader or of both replicas in the
scale-up's window, KCM back and MCM still at 0 (KCM must not be lowered again). The
extras start around the scale-down or around the scale-up (tests/soak/plan.py).

After each cycle everything is healed and the rig must settle within 60 s: the
controllers at their replicas (an operator's count first, then the suite sets it back)
without a record, both replicas healthy, one leader.
"""

from __future__ import annotations

import argparse
import math
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from testenv.base.wait import eventually
from testenv.kube.controllers import CONTROLLERS
from tests.soak import plan
from tests.soak.plan import Plan
from tests.soak.report import Result, check, defects, report
from tests.soak.rig import NODES, Rig, rig, wall

SETTLE_S = 60.0
# Past the aggregator's blind limit (2 min): a rig that has not settled by then never will.
LAST_CHANCE_S = 150.0


def run_cycle(r: Rig, p: Plan) -> Result:
    mark = r.journal.mark()
    r.journal(f"cycle {p.n}: {p.describe()}")
    res = Result(p, wall())
    with plan.watchdog(r, p, res.tally):
        _cycle(r, p, res)
    r.journal(f"cycle {p.n} done")
    res.end_wall = wall()
    res.journal = r.journal.since(mark)
    return res


def _cycle(r: Rig, p: Plan, res: Result) -> None:
    t_start = time.monotonic()
    with plan.running(r, p, res.tally) as (healed, finish):
        t_cut = time.monotonic()
        if p.kind == "kapi-restart":
            # The load balancer admits nothing from the moment the server stops being ready.
            r.cut(frozenset(NODES))
            r.journal("stopping the shoot KAPI; no node renews")
            r.shoot.shoot.stop_apiserver()
            r.journal("shoot KAPI stopped")
            time.sleep(p.duration_s)
            # The nodes' load balancer admits them a second after /readyz is 200. The
            # aggregators, straight at it, list and watch it seconds before that under load,
            # and judge only from its readiness on (aggregator/decide/trust.py).
            r.shoot.shoot.start_apiserver()
            r.journal("shoot KAPI ready")
            time.sleep(1.0)
        else:
            r.cut(p.cut)
            r.journal(f"cut {sorted(p.cut)}")
            time.sleep(p.duration_s)
        r.restore_nodes()
        t_heal = time.monotonic()
        healed.set()
        r.journal("nodes renew again")
        finish()
    r.heal()
    t_healed = time.monotonic()
    r.journal("everything healed")
    # An operator's count scaled while held down is what must come back, until they set it back.
    settled = eventually(lambda: r.settled(res.tally.expected()), SETTLE_S)
    res.settle_s = time.monotonic() - t_healed if settled else None
    t_reset = math.inf
    if res.tally.operator is not None:
        name = res.tally.operator[0]
        t_reset = time.monotonic()
        r.scale(name, CONTROLLERS[name], "operator, setting it back")
        settled = eventually(r.settled, SETTLE_S) and settled
    t_end = time.monotonic()
    check(res, r.sampler.between(t_start, t_end), t_cut, t_heal, t_reset)
    if not settled:
        res.notes.append(f"not settled {SETTLE_S:.0f}s after the heal: {r.describe()}")
        if eventually(r.settled, LAST_CHANCE_S):
            res.notes.append(f"settled {time.monotonic() - t_healed:.0f}s after the heal")
        else:
            res.notes.append(f"still not settled after {LAST_CHANCE_S:.0f}s more: {r.describe()}")


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


def run(cycles: int = 50, seed: int = 1, workdir: Path | None = None) -> list[Result]:
    """``cycles`` cycles of seed ``seed``'s plan, the report printed; the cycles run, fewer when
    the rig did not settle or the run was interrupted. Logs in ``workdir`` (a new temporary
    directory by default)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="dwd-faults-"))
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
                x = run_cycle(r, plan.draw(rng, n))
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
    return results


def failures(results: list[Result], cycles: int) -> list[str]:
    """What makes a run fail: every defect counted, and cycles that never ran (the rig did not
    settle, or the run was interrupted). Empty for a run that passed."""
    found = [f"{label}: {count}" for label, count in defects(results).items() if count]
    if len(results) < cycles:
        found.append(f"{len(results)} of {cycles} cycles run")
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=50, help="how many cycles (default 50)")
    parser.add_argument("--seed", type=int, default=1, help="the random plan's seed (default 1)")
    args = parser.parse_args(argv)
    if found := failures(run(args.cycles, args.seed), args.cycles):
        sys.exit("fault suite FAILED: " + "; ".join(found))


if __name__ == "__main__":
    main()
