"""One aggregator, a whole seed of targets: healthy, then every shoot cut at once, then healed.

    python -m bench.seed [--targets 1,50,100,250] [--nodes 10] [--window 600] [--outages 3] [--code DIR]
                         [--replicas 1] [--shards 8]

Real seed and shoot kube-apiservers; per target a control-plane namespace with a Cluster of a
real one's size (25 KB), the kubeconfig Secret and the three dependents. The targets share one
shoot API server and its nodes: ``--nodes`` simulated agents (testenv/worlds/agent_fleet.py) renew the leases
every target judges, so every target sees the same shoot and a cut of those agents is a cut of
every shoot at the same instant. What differs from a real seed: 250 targets provision the same
leases (their creates collide and are answered 409 at start-up) and send their watches, probes
and confirming LISTs to one shoot API server instead of 250; that API server's load is
this benchmark's, not a seed's.

The aggregator (``DWD_TARGETS=gardener``, no node grace because the nodes are minutes old,
its defaults otherwise: testenv/worlds/targets.py) runs as its own process with a certificate of its
own, from this tree or from another (``--code DIR``: an older checkout, for a before and
after). Its seed requests are counted from the seed API server's audit log, which records its
user alone.

Per size: start-up until every target judges the shoot healthy; a healthy window
(``--window``, 10 minutes by default) with the aggregator's CPU, RSS and seed requests by verb
and resource, and every replica change counted (a false scale-down); then every agent
silenced at once, timed per target until its three dependents are at 0 (the seed's watch
sees the write), healed, timed until each is back at its replicas without our record;
``--outages`` times, each cut once every target judges its shoot healthy again (one cut of
250 targets is one draw: the median target's time spread 3 s between runs). Each process's
CPU seconds from a cut until the last target's three are at 0, beside that span at the
healthy pace, say whose work the outage is. CPU over the outages runs from the first cut to
the last restore; the loop lag is the aggregator's own ``/status`` p99 over the minute
before it is read, once per cut, and its max since the process started. What the interlocks
refused in each cut is ``dwd_scale_down_blocked_total`` read from the aggregators' /metrics
before the cut and once the last target's three are at 0: by reason (the label's values, none
assumed), the refusals and the targets refused. The seed's deployments get a status that
follows their spec from the benchmark (testenv/kube/deployment_watch.py), as a deployment controller would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aggregator.model.records import RECORD
from bench.tools.sampling import cpu_s, rss_mib
from bench.tools.stats import min_median_max
from bench.tools.table import Column, print_columns, print_table
from testenv.base.wait import wait_for
from testenv.kube.audit import Audit, audit_args, audited_kubeconfig
from testenv.kube.controllers import CONTROLLERS
from testenv.kube.controlplane import ControlPlane, ensure_namespace
from testenv.kube.deployment_watch import DeploymentWatch
from testenv.kube.kapi_metrics import Series, parse_metrics
from testenv.worlds.agent_fleet import Fleet, FleetThread
from testenv.worlds.targets import SHOOT_USER, access_kubeconfig, aggregators, namespace, populate

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = "dwd_scale_down_blocked_total"


def status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
        out: dict[str, Any] = json.load(r)
        return out


def blocked_series(port: int) -> Series:
    """The aggregator's ``dwd_scale_down_blocked_total`` samples, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return [s for s in parse_metrics(text, [BLOCKED]) if s[0] == BLOCKED]


# reason -> target -> refusals
Refusals = dict[str, dict[str, float]]


def refusals(before: Series, after: Series) -> Refusals:
    """What the interlocks refused between two scrapes (the replicas' samples summed), by
    reason and target; only the pairs that grew."""

    def by_key(series: Series) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for _, labels, v in series:
            key = (labels.get("reason", ""), labels.get("target", ""))
            out[key] = out.get(key, 0.0) + v
        return out

    b = by_key(before)
    grown: Refusals = {}
    for (reason, target), v in sorted(by_key(after).items()):
        if v > b.get((reason, target), 0.0):
            grown.setdefault(reason, {})[target] = v - b.get((reason, target), 0.0)
    return grown


def refusals_text(cuts: list[Refusals]) -> str:
    """Per reason, the refusals over every cut and the distinct targets refused, then each
    cut's refusals: "kapi_probe_failed 242 (125 targets; each cut 121 / 121)"."""
    parts = []
    for reason in sorted({r for cut in cuts for r in cut}):
        each = [sum(cut.get(reason, {}).values()) for cut in cuts]
        hit = {t for cut in cuts for t in cut.get(reason, {})}
        per_cut = f"; each cut {' / '.join(f'{n:.0f}' for n in each)}" if len(cuts) > 1 else ""
        parts.append(f"{reason} {sum(each):.0f} ({len(hit)} targets{per_cut})")
    return ", ".join(parts) or "none"


class Sampler:
    """The aggregators' CPU over a stretch (all replicas', summed) and the largest RSS of any,
    sampled while waiting."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.t0 = pids, time.monotonic()
        self.cpu0, self.rss_max = self._cpu(), max(rss_mib(p) for p in pids)

    def _cpu(self) -> float:
        return sum(cpu_s(p) for p in self.pids)

    def sample(self) -> None:
        self.rss_max = max(self.rss_max, *(rss_mib(p) for p in self.pids))

    def cpu_pct(self) -> float:
        return 100 * (self._cpu() - self.cpu0) / (time.monotonic() - self.t0)


def wait_all(
    deps: DeploymentWatch,
    targets: int,
    *,
    since: float,
    want: dict[str, tuple[int, bool]],
    timeout_s: float,
    sampler: Sampler,
) -> list[float]:
    """Per target, seconds from ``since`` until all its dependents showed ``want``
    (replicas, recorded); the targets that did not within ``timeout_s`` are left out."""
    deadline = time.monotonic() + timeout_s
    done: dict[str, float] = {}
    while len(done) < targets and time.monotonic() < deadline:
        time.sleep(0.5)
        sampler.sample()
        for i in range(targets):
            ns = namespace(i)
            if ns in done:
                continue
            at = [deps.first(ns, name, since, *want[name]) for name in CONTROLLERS]
            if all(a is not None for a in at):
                done[ns] = max(a for a in at if a is not None) - since
    return list(done.values())


def _groups(pids: list[int], seed: ControlPlane, shoot: ControlPlane) -> dict[str, list[int]]:
    """Every process of the rig by what it plays (the aggregators' ``pids``)."""
    if len(pids) == 1:
        mine = {"aggregator": pids}
    else:
        mine = {f"aggregator {i + 1}": [p] for i, p in enumerate(pids)}
    return {
        **mine,
        "seed API server and etcd": seed.pids(),
        "shoot API server and etcd": shoot.pids(),
        "this benchmark (agents, deployment controller)": [os.getpid()],
    }


def measure(
    targets: int,
    nodes: int,
    code: Path,
    window_s: float,
    *,
    outages: int = 1,
    replicas: int = 1,
    shards: int = 1,
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dwd-bench-seed-"))
    audit_log = tmp / "audit.log"
    plane = ControlPlane(extra_apiserver_args=audit_args(tmp / "audit-policy.yaml", audit_log))
    # The shoot's audit log has the aggregator's shoot requests (by its service account), to
    # tell the shoot API server's time from the aggregator's when a figure grows.
    shoot_plane = ControlPlane(
        extra_apiserver_args=audit_args(tmp / "shoot-audit-policy.yaml", tmp / "shoot-audit.log", SHOOT_USER)
    )
    with plane.running() as seed, shoot_plane.running() as shoot, seed.admin_client() as admin:
        kubeconfig = audited_kubeconfig(seed, tmp / "aggregator.kubeconfig")
        populate(admin, targets, access_kubeconfig(shoot))
        ensure_namespace(admin, "garden")  # the shard Leases'

        fleet = FleetThread(Fleet(shoot.url, shoot.ca_file, (str(shoot.admin.cert), str(shoot.admin.key))))
        audit = Audit(audit_log)
        try:
            names = fleet.add(nodes)
            fleet.start_renewing()
            with (
                DeploymentWatch(seed.admin_client, RECORD) as deps,
                aggregators(kubeconfig, code, tmp, replicas, shards) as procs,
            ):
                pids, ports = [p.pid for p, _ in procs], [port for _, port in procs]
                groups = _groups(pids, plane, shoot_plane)
                rig = Rig(targets, names, fleet, deps, audit, pids, ports, groups, outages, shards)
                return _phases(rig, window_s)
        finally:
            fleet.close()


@dataclass(frozen=True)
class Rig:
    targets: int
    names: list[str]
    fleet: FleetThread
    deps: DeploymentWatch
    audit: Audit
    pids: list[int]
    ports: list[int]
    # Every process of the rig by what it plays: the machine's work in the outage, by whom.
    groups: dict[str, list[int]]
    outages: int = 1
    shards: int = 1

    def lag(self) -> list[dict[str, Any]]:
        return [status(port).get("loop_lag", {}) for port in self.ports]

    def blocked(self) -> Series:
        """Every replica's refusal counters (each counts the refusals of the targets it acts for)."""
        return [s for port in self.ports for s in blocked_series(port)]

    def cpu(self) -> dict[str, float]:
        return {name: sum(cpu_s(pid) for pid in pids) for name, pids in self.groups.items()}


def _phases(rig: Rig, window_s: float) -> dict[str, Any]:
    targets, deps, audit, pids = rig.targets, rig.deps, rig.audit, rig.pids
    started = time.monotonic()

    def judging() -> bool:
        """Every replica judges every target healthy, and (sharded) every shard is held."""
        with contextlib.suppress(OSError, ValueError):
            seen = [status(port) for port in rig.ports]
            healthy = all(
                len(st["targets"]) == targets and all(t["phase"] == "healthy" for t in st["targets"])
                for st in seen
            )
            held = sorted(i for st in seen for i in (st.get("shards") or {}).get("held", []))
            return healthy and (len(seen) == 1 or held == list(range(rig.shards)))
        return False

    wait_for(judging, 300, f"{targets} targets judging", every_s=1.0)
    out: dict[str, Any] = {"ready_s": time.monotonic() - started}
    time.sleep(5)  # past the start's own reads

    mark, healthy, cpu_t0 = audit.mark(), Sampler(pids), rig.cpu()
    t0 = time.monotonic()
    while time.monotonic() < t0 + window_s:
        time.sleep(min(5.0, t0 + window_s - time.monotonic()))
        healthy.sample()
    t1, cpu_t1 = time.monotonic(), rig.cpu()
    # What each process spends per second while nothing happens: the outage's span at this pace
    # is the background its work is measured against.
    out["healthy_cpu"] = {name: (cpu_t1[name] - cpu_t0[name]) / (t1 - t0) for name in cpu_t1}
    counts = audit.since(mark)
    out |= {
        "cpu_healthy": healthy.cpu_pct(),
        "rss_healthy": healthy.rss_max,
        "rates": {k: v / (t1 - t0) for k, v in counts.items()},
        "lag_healthy": rig.lag(),
        "false": len(deps.changes(t0, t1)),
    }

    outage = Sampler(pids)
    out |= {"down": [], "restored": [], "down_runs": [], "burst_s": [], "burst_cpu": [], "lag_outage": []}
    out["refused"] = []
    for i in range(rig.outages):
        if i:
            # The next cut once every target judges its shoot healthy again, its leases fresh.
            wait_for(judging, 300, f"{targets} targets healthy again", every_s=1.0)
            time.sleep(15)
        _outage(rig, out, outage)
    out |= {"cpu_outage": outage.cpu_pct(), "rss_outage": outage.rss_max, "targets": targets}
    return out


def _outage(rig: Rig, out: dict[str, Any], sampler: Sampler) -> None:
    """Every agent silenced at once until every target's three are at 0, then healed until
    every target has them back; each figure appended to ``out``'s lists."""
    blocked0 = rig.blocked()
    t_cut, cpu_cut = time.monotonic(), rig.cpu()
    rig.fleet.silence(rig.names)
    down = dict.fromkeys(CONTROLLERS, (0, True))
    times = wait_all(rig.deps, rig.targets, since=t_cut, want=down, timeout_s=120, sampler=sampler)
    # From the cut until the last target's three were seen at 0 (within wait_all's 0.5 s).
    out["burst_s"].append(time.monotonic() - t_cut)
    cpu_down = rig.cpu()
    out["burst_cpu"].append({name: cpu_down[name] - cpu_cut[name] for name in cpu_down})
    out["lag_outage"].append(rig.lag())
    out["refused"].append(refusals(blocked0, rig.blocked()))
    out["down"] += times
    out["down_runs"].append(min_median_max(times))
    t_heal = time.monotonic()
    rig.fleet.resume()
    up = {name: (replicas, False) for name, replicas in CONTROLLERS.items()}
    out["restored"] += wait_all(rig.deps, rig.targets, since=t_heal, want=up, timeout_s=240, sampler=sampler)


def _lag(lags: list[dict[str, Any]], key: str = "p99_s") -> str:
    """The loop lag p99 (or ``key``) of each replica."""
    return ", ".join(f"{lag[key] * 1000:.0f} ms" if lag.get(key) is not None else "-" for lag in lags)


def _never(times: list[float], m: dict[str, Any]) -> str:
    wanted = m["targets"] * len(m["down_runs"])  # every target, every cut
    return "" if len(times) == wanted else f" ({wanted - len(times)} never)"


def _by_kind(rates: dict[str, float]) -> str:
    return ", ".join(f"{k} {rate:.2f}/s" for k, rate in sorted(rates.items()) if rate >= 0.005) or "none"


# A size's measure, m, in a row of each table.
HEALTHY: list[Column[dict[str, Any]]] = [
    ("targets", lambda m: m["targets"]),
    ("start -> all judging", lambda m: f"{m['ready_s']:.0f} s"),
    ("CPU", lambda m: f"{m['cpu_healthy']:.1f} %"),
    ("RSS", lambda m: f"{m['rss_healthy']:.0f} MiB"),
    ("seed req/s", lambda m: f"{sum(m['rates'].values()):.2f}"),
    ("by verb and resource", lambda m: _by_kind(m["rates"])),
    ("loop lag p99", lambda m: _lag(m["lag_healthy"])),
    ("false scale-downs", lambda m: m["false"]),
]
OUTAGE: list[Column[dict[str, Any]]] = [
    ("targets", lambda m: m["targets"]),
    (
        "cut -> all three at 0 (min / median / max, every cut)",
        lambda m: min_median_max(m["down"]) + _never(m["down"], m),
    ),
    ("each cut", lambda m: "; ".join(m["down_runs"])),
    ("heal -> restored", lambda m: min_median_max(m["restored"]) + _never(m["restored"], m)),
    ("CPU cut -> restored", lambda m: f"{m['cpu_outage']:.1f} %"),
    ("RSS max", lambda m: f"{m['rss_outage']:.0f} MiB"),
    ("loop lag p99 (each cut)", lambda m: " / ".join(_lag(lag) for lag in m["lag_outage"])),
    (
        "loop lag max since start (healthy; each cut)",
        lambda m: "; ".join(_lag(lag, "max_s") for lag in [m["lag_healthy"], *m["lag_outage"]]),
    ),
    (
        "interlocks refused, cut -> all at 0 (by reason: refusals, distinct targets)",
        lambda m: refusals_text(m["refused"]),
    ),
]


def _work_row(m: dict[str, Any]) -> list[object]:
    """Each outage's span and CPU, averaged: one cut is one draw of where the agents' renewals
    and the periodic reads happen to fall."""
    span_s = statistics.mean(m["burst_s"])
    cpu = {k: statistics.mean(c[k] for c in m["burst_cpu"]) for k in m["burst_cpu"][0]}
    at_rest = {name: rate * span_s for name, rate in m["healthy_cpu"].items()}
    return (
        [m["targets"], f"{span_s:.1f} s"]
        + [f"{v:.2f} ({at_rest[k]:.2f})" for k, v in cpu.items()]
        + [f"{sum(cpu.values()):.2f} ({sum(at_rest.values()):.2f})"]
    )


def run(
    sizes: list[int],
    nodes: int,
    code: Path,
    window_s: float,
    *,
    outages: int,
    label: str,
    replicas: int = 1,
    shards: int = 1,
) -> None:
    who = "One aggregator" if replicas == 1 else f"{replicas} aggregators, {shards} shards"
    ms = [measure(n, nodes, code, window_s, outages=outages, replicas=replicas, shards=shards) for n in sizes]
    title = f"{who}, a seed of targets, healthy ({label}; {nodes} nodes a shoot, {window_s:.0f} s)"
    print_columns(title, HEALTHY, ms)
    print_columns(f"The same, every shoot cut at once, then healed, {outages} times ({label})", OUTAGE, ms)
    groups = list(ms[-1]["burst_cpu"][0])
    print_table(
        f"The outage's work: CPU seconds from the cut until every target's three were at 0 (the "
        f"cuts' mean), in brackets the same span at the healthy window's pace ({label})",
        [
            "targets",
            "cut -> last at 0",
            *(g.removesuffix(" (agents, deployment controller)").removesuffix(" and etcd") for g in groups),
            f"all ({os.cpu_count()} cores here)",
        ],
        [_work_row(m) for m in ms],
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.seed")
    p.add_argument("--targets", default="1,50,100,250", help="comma-separated target counts")
    p.add_argument("--nodes", type=int, default=10, help="simulated nodes of the shared shoot")
    p.add_argument("--window", type=float, default=600.0, help="seconds of healthy state measured")
    p.add_argument("--code", type=Path, default=ROOT, help="the tree the aggregator runs from")
    p.add_argument("--outages", type=int, default=3, help="seed-wide outages per size, one after the other")
    p.add_argument("--replicas", type=int, default=1, help="aggregators; more than one share out shards")
    p.add_argument("--shards", type=int, default=8, help="shard Leases, with --replicas 2 or more")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.targets.split(",")]
    code = args.code.resolve()
    label = "this tree" if code == ROOT else str(code)
    shards = args.shards if args.replicas > 1 else 1
    run(
        sizes,
        args.nodes,
        code,
        args.window,
        outages=args.outages,
        label=label,
        replicas=args.replicas,
        shards=shards,
    )


if __name__ == "__main__":
    main()
