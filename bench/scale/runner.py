"""bench.scale's runner: each size measured in a fresh shoot beside one seed, printed, and its
raw numbers written; --analysis prints the sampling error on paper instead."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aggregator.act import budget
from bench.scale.model import FAST_S
from bench.scale.scenarios import (
    Run,
    churn,
    must_not_scale,
    must_scale,
    no_budget,
    sampled_verdicts,
    startup,
    steady,
)
from bench.scale.tables import print_analysis, print_results
from core.lease import MISSING_MAX_WAIT_S
from testenv.kube.audit import Audit, audit_args, audited_kubeconfig
from testenv.kube.controlplane import ControlPlane
from testenv.kube.kapi_metrics import Kapi
from testenv.worlds.agent_fleet import ZONES, Fleet, FleetThread
from testenv.worlds.shoot_world import Shoot


def _settle(result: dict[str, Any], pacing: budget.Pacing) -> None:
    """Slow nodes renew first at start, next half to one and a half intervals later
    (core.lease.next_renewal_in_s): from half an interval on the rate is steady. A slow
    node's first renewal may wait out a 404 first (up to MISSING_MAX_WAIT_S)."""
    since = time.monotonic() - result["startup"]["provisioned_at"]
    settle = MISSING_MAX_WAIT_S + pacing.slow_interval_s / 2 + 5 - since
    if pacing.slow_interval_s > FAST_S and settle > 0:
        time.sleep(settle)


def _healthy_phases(run: Run, result: dict[str, Any]) -> None:
    """Start-up, churn and the steady window."""
    n = run.n
    print(f"[{n}] {n} nodes in {result['create_nodes_s']} s; starting the aggregator", file=sys.stderr)
    result["startup"] = startup(run)
    print(f"[{n}] provisioned: {result['startup']}", file=sys.stderr)
    pacing = run.planned()
    result["sample"] = len(pacing.fast)
    result["slow_interval_s"] = pacing.slow_interval_s
    result["churn"] = churn(run)
    print(f"[{n}] churn: {result['churn']}", file=sys.stderr)
    _settle(result, pacing)
    result["steady"] = steady(run, 30.0 if n <= 100 else 40.0)
    print(f"[{n}] steady: {result['steady']}", file=sys.stderr)


def _outages(run: Run, result: dict[str, Any], *, no_budget_run: bool, trials: int) -> None:
    """Cuts that must not scale down, cuts that must, random ones, and no budget."""
    n, fleet = run.n, run.fleet
    sampler = run.shoot.sampler(0.1)
    rng = random.Random(n)
    result["spread_30"] = must_not_scale(run, sampler, rng.sample(run.names, round(0.3 * len(run.names))), 30)
    result["zone_a"] = must_not_scale(run, sampler, fleet.fleet.in_zones(["zone-a"]), 30)
    print(f"[{n}] no scale-down: {result['spread_30']} {result['zone_a']}", file=sys.stderr)
    result["spread_70"] = must_scale(run, sampler, rng.sample(run.names, round(0.7 * len(run.names))))
    two = fleet.fleet.in_zones(ZONES[1:])
    rest = [x for x in run.names if x not in set(two)]
    more = rng.sample(rest, max(0, round(0.7 * len(run.names)) - len(two)))
    result["zones_bc_plus"] = must_scale(run, sampler, two + more)
    print(f"[{n}] scale-down: {result['spread_70']} {result['zones_bc_plus']}", file=sys.stderr)
    if trials:
        result["trials"] = sampled_verdicts(run, 0.5, trials) + sampled_verdicts(run, 0.7, trials)
    if no_budget_run:
        result["no_budget"] = no_budget(run, sampler, 30.0)
        print(f"[{n}] no budget: {result['no_budget']}", file=sys.stderr)
    result["simulator_requests"] = {" ".join(k): v for k, v in sorted(fleet.requests().items())}


def measure(
    n: int, seed: ControlPlane, tmp: Path, result: dict[str, Any], *, no_budget_run: bool, trials: int
) -> None:
    """Fills ``result`` as it goes: a run that fails half-way keeps what it measured."""
    namespace = f"shoot--scale--n{n}"
    result["nodes"] = n
    audit_log = tmp / f"audit-{n}.log"
    plane = ControlPlane(extra_apiserver_args=audit_args(tmp / f"audit-policy-{n}.yaml", audit_log))
    with plane.running():
        kubeconfig = audited_kubeconfig(plane, tmp / f"aggregator-{n}.kubeconfig")
        shoot = Shoot(plane, seed, namespace, tmp)
        shoot.setup(nodes=0)
        admin = plane.admin
        fleet = FleetThread(Fleet(plane.url, plane.ca_file, (str(admin.cert), str(admin.key))))
        kapi = Kapi(shoot.shoot)
        try:
            t0 = time.monotonic()
            names = fleet.add(n)
            result["create_nodes_s"] = round(time.monotonic() - t0, 1)
            run = Run(n, shoot, fleet, kapi, names, Audit(audit_log), kubeconfig)
            _healthy_phases(run, result)
            _outages(run, result, no_budget_run=no_budget_run, trials=trials)
        finally:
            fleet.close()
            kapi.close()
            shoot.close()


def _run_sizes(sizes: list[int], no_budget_sizes: set[int], trials: int, out: Path) -> None:
    """Each size measured and printed; the raw numbers written to ``out`` after each."""
    results: list[dict[str, Any]] = []
    if out.exists():
        # Sizes run separately land in one file; a size run again replaces its old entry.
        results = [r for r in json.loads(out.read_text()).get("runs", []) if r.get("nodes") not in sizes]
    with ControlPlane().running() as seed, tempfile.TemporaryDirectory(prefix="dwd-scale-") as tmp:
        for n in sizes:
            r: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
            try:
                measure(n, seed, Path(tmp), r, no_budget_run=n in no_budget_sizes, trials=trials)
            except Exception as e:
                r["error"] = f"{type(e).__name__}: {e}"
                print(f"[{n}] failed: {r['error']}", file=sys.stderr)
            else:
                print_results(r)
            results = [x for x in results if x.get("nodes") != n] + [r]
            out.write_text(json.dumps({"runs": sorted(results, key=lambda x: x["nodes"])}, indent=1))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--no-budget-at", default="5000", help="sizes to run again with every node at 2 s")
    parser.add_argument("--trials", type=int, default=3, help="random 50 %% and 70 %% cuts per size")
    parser.add_argument("--out", default="/tmp/scale-results.json")
    parser.add_argument(
        "--analysis", action="store_true", help="only the sampling error, on paper and by Monte Carlo"
    )
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.nodes.split(",") if x]
    if args.analysis:
        for n in sizes:
            print_analysis(n)
        return
    no_budget_sizes = {int(x) for x in args.no_budget_at.split(",") if x}
    _run_sizes(sizes, no_budget_sizes, args.trials, Path(args.out))
    print(f"\nraw numbers: {Path(args.out)}")


if __name__ == "__main__":
    main()
