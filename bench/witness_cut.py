"""A real cut before and after the second witness: load balancer cut -> every controller at 0.

    python -m bench.witness_cut [--runs 5] [--before DIR]

The demo's world (demo/scenario.py): ten nodes, each a real agent and a kubelet stand-in
renewing every 10 s, both through one load balancer; real KCM; the aggregator with its
defaults (node grace 0 s, as in the demo: the nodes are new). A real cut silences the
kubelets with the agents, so the witness must not delay protection: all it may add is the
interlock's LIST of kubelet leases.

Each run starts an aggregator from one tree, waits for its healthy verdict, closes the load
balancer and times it until KCM, MCM and CA are all at 0, then heals and waits until every
controller is back without a record. The trees alternate run by run (today's, then the one
before the witness, then the other way round), so a change in the machine's load falls on
both. The tree before the witness is commit ``PRE_WITNESS`` (``git archive``d into a
temporary directory), or ``--before``; its aggregator runs with ``PYTHONPATH`` on it and
``PYTHONSAFEPATH=1``, so neither the working directory nor the editable install wins.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aggregator.records import RECORD
from bench.table import print_table
from core.lease import DEFAULT_LEASE_NAMESPACE, leases_path, parse_micro_time
from demo import scenario
from testenv.controllers import CONTROLLERS, DOWN
from testenv.process import Process, json_log
from testenv.standins import DEPLOYMENTS
from testenv.wait import wait_for

ROOT = Path(__file__).resolve().parents[1]
# The first parent of the merge that brought the witness (8687c0a "Merge branch 'witness'").
PRE_WITNESS = "525dc0b82c56e63e735c6f3ab805bf02b1cf7d30"
TREES = ("today", "before")


@contextlib.contextmanager
def tree_at(commit: str) -> Iterator[Path]:
    """The source tree of ``commit``, extracted (not a worktree: the repository is not changed)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True)
    with tempfile.TemporaryDirectory(prefix="dwd-pre-witness-") as d:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(d, filter="data")
        yield Path(d)


def code_env(tree: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}


def summary(xs: Sequence[float]) -> tuple[float, float, float]:
    """Median, min, max."""
    return statistics.median(xs), min(xs), max(xs)


@dataclass(frozen=True)
class Cut:
    cut_s: float  # the load balancer closed -> every controller at 0 (this machine's clock)
    # The last agent renewal that landed -> every controller at 0: without the moment of the cut
    # within the agents' 2 s interval, which spreads the first figure by up to 2 s.
    renewal_s: float


def rows(cuts: dict[str, list[Cut]]) -> list[list[str]]:
    out = []
    for name in TREES:
        figures = [*summary([c.cut_s for c in cuts[name]]), *summary([c.renewal_s for c in cuts[name]])]
        out.append([name, str(len(cuts[name])), *(f"{x:.2f}" for x in figures)])

    def delta(figure: Callable[[Cut], float]) -> str:
        medians = [statistics.median(map(figure, cuts[name])) for name in TREES]
        return f"{medians[0] - medians[1]:+.2f}"

    out.append(["today - before", "", delta(lambda c: c.cut_s), "", "", delta(lambda c: c.renewal_s), "", ""])
    return out


def one_cut(w: dict[str, Any], tmp: Path, env: dict[str, str]) -> Cut:
    tmp.mkdir()
    seed_admin = w["seed_admin"]

    def deployments() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = seed_admin.get(DEPLOYMENTS.format(ns=scenario.NAMESPACE))["items"]
        return items

    def replicas() -> dict[str, int]:
        return {d["metadata"]["name"]: d["spec"].get("replicas", 1) for d in deployments()}

    log = scenario.start_aggregator(w, tmp, env, {"DWD_NODE_GRACE": "0s"})
    aggregator: Process = w["procs"][-1]
    try:
        wait_for(lambda: any(e.get("phase") == "healthy" for e in json_log(log)), 90, "a healthy verdict")
        wait_for(
            lambda: all(a < 4 for a in scenario.lease_ages(w["shoot_admin"])), 30, "every lease renewing"
        )
        time.sleep(2)  # as the demo: the healthy verdict has held a moment before the cut
        w["lb"].close()
        cut = time.monotonic()
        wait_for(lambda: replicas() == DOWN, 120, "every controller scaled down", every_s=0.05)
        took = time.monotonic() - cut
        down_wall = datetime.now(UTC)
        last_renewal = max(
            parse_micro_time(x["spec"]["renewTime"])
            for x in w["shoot_admin"].get(leases_path(DEFAULT_LEASE_NAMESPACE))["items"]
        )
        w["lb"].open()
        wait_for(lambda: replicas() == CONTROLLERS, 240, "every controller restored", every_s=0.5)
        wait_for(
            lambda: not any(RECORD in (d["metadata"].get("annotations") or {}) for d in deployments()),
            60,
            "no record left",
        )
        return Cut(took, (down_wall - last_renewal).total_seconds())
    finally:
        aggregator.terminate(15)


def run(runs: int = 5, before: Path | None = None) -> None:
    with contextlib.ExitStack() as stack:
        old = before or stack.enter_context(tree_at(PRE_WITNESS))
        if (old / "aggregator" / "witness.py").exists():
            raise SystemExit(f"{old} has the witness: not the code before it")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dwd-witness-cut-")))
        show = scenario.Show(None, scenario.Timeline())
        w = stack.enter_context(scenario.world(10, tmp, show))
        envs = {"today": code_env(ROOT), "before": code_env(old)}
        scenario.start_agents(w, tmp, envs["today"])
        cuts: dict[str, list[Cut]] = {name: [] for name in TREES}
        for i in range(runs):
            for name in TREES if i % 2 == 0 else TREES[::-1]:
                c = one_cut(w, tmp / f"{name}-{i}", envs[name])
                cuts[name].append(c)
                print(
                    f"run {i + 1}/{runs} {name}: all at 0 {c.cut_s:.2f}s after the cut, "
                    f"{c.renewal_s:.2f}s after the last renewal",
                    flush=True,
                )
    print_table(
        "A real cut -> KCM, MCM and CA at 0, aggregator defaults (lease 8s, confirm 4s), "
        f"before the witness ({PRE_WITNESS[:7]}) and today, seconds from the cut and from the "
        "last agent renewal",
        [
            "aggregator",
            "runs",
            "cut: median",
            "min",
            "max",
            "last renewal: median",
            "min",
            "max",
        ],
        rows(cuts),
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.witness_cut", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="cuts per tree (default 5)")
    parser.add_argument(
        "--before", type=Path, help=f"the tree before the witness (default: {PRE_WITNESS[:7]}, extracted)"
    )
    args = parser.parse_args()
    run(args.runs, args.before)


if __name__ == "__main__":
    main()
