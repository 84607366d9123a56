"""The real kubelet's node lease, measured against the second witness's model of it
(aggregator/decide/witness.py: a renewal every quarter of 40 s, each wait stretched by up to 4 %, and
``DeciderSettings.witness_slack_s`` 1.5 s for it to land).

    python -m bench.kubelet [--nodes 5] [--steady-seconds 60] [--cut-seconds 30]
                            [--blip-seconds 3] [--after-seconds 75]

The rig (testenv/worlds/hollow_world.py): a control plane on loopback and N hollow kubelets (kubemark,
the kubelet's own code: testenv/kube/hollow.py), each reaching KAPI through a load balancer of its
own (testenv/net/tcpproxy.py) with its node credentials. The leases and Nodes are listed every
100 ms through the admin client, straight to KAPI: a renewal's time on the node's clock
(renewTime; the same machine's clock here) and when our read first showed it.

Three cuts of every load balancer, each healed and followed until every kubelet has renewed:
- blackhole: the backend gone, packets dropped; the open connections never hear a close and
  stay dead after the heal (as after a failover that lost their state);
- refused: the load balancer gone; open connections reset, new ones refused;
- a blip: the blackhole for a few seconds only.
During the long cuts, half the nodes are marked Ready=Unknown (what KCM does after its grace),
so that after the heal the kubelet has a status change to post; the others' status is unchanged,
which kubelet reports only every 5 min (nodeStatusReportFrequency, ±50 % after a change).

Retries are read from each kubelet's log (the lease controller logs every failed request) and
from its load balancer (connections it accepted during the cut).
"""

from __future__ import annotations

import argparse
import itertools
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aggregator.model.observed import KUBELET_JITTER, KUBELET_LEASE_DURATION_S, KUBELET_RENEW_FRACTION
from aggregator.model.settings import DeciderSettings
from bench.tools.sampling import cpu_s, rss_mib
from bench.tools.stats import min_median_max
from bench.tools.table import print_table
from testenv.base.wait import eventually
from testenv.kube.hollow import KlogLine
from testenv.worlds.hollow_world import Rig, Seen, mark_unknown, rig, set_cut

MODEL_INTERVAL_S = KUBELET_LEASE_DURATION_S * KUBELET_RENEW_FRACTION
# The model's due time after a renewal: a read sent later that still shows it finds the node silent.
MODEL_DUE_S = MODEL_INTERVAL_S * (1 + KUBELET_JITTER) + DeciderSettings().witness_slack_s
# What the lease controller logs for each failed request (an update, or the GET of ensureLease).
FAILED_REQUEST = ("Failed to update lease", "Failed to ensure lease exists")
# A request's 10 s timeout, as client-go words it (its own timer, or the request's context).
TIMED_OUT = ("Client.Timeout exceeded", "context deadline exceeded")


@dataclass
class Steady:
    seconds: float
    intervals: list[float]  # successive renewTimes of a node (the node's clock)
    seen_intervals: list[float]  # successive renewals as our reads first showed them
    landing: list[float]  # renewTime -> first seen by a read
    next_seen: list[float]  # a renewTime -> the next renewal seen: what the model's due bounds
    status_posts: int  # Ready condition changes (lastHeartbeatTime) in the window
    rss_mib: list[float]
    cpu_ms_per_s: list[float]


def steady(r: Rig, seconds: float) -> Steady:
    """The kubelets left alone for ``seconds`` on a working path."""
    pids = [k.process.pid for k in r.kubelets if k.process is not None]
    cpu0 = {pid: cpu_s(pid) for pid in pids}
    start = time.time()
    time.sleep(seconds)  # the window measured
    end = time.time()
    out = Steady(seconds, [], [], [], [], 0, [rss_mib(pid) for pid in pids], [])
    out.cpu_ms_per_s.extend((cpu_s(pid) - cpu0[pid]) * 1000 / (end - start) for pid in pids)
    for node in r.nodes:
        seen = r.reads.renewals_between(node, start, end)
        out.landing.extend(s.at - s.stamp for s in seen)
        for a, b in itertools.pairwise(seen):
            out.intervals.append(b.stamp - a.stamp)
            out.seen_intervals.append(b.at - a.at)
            out.next_seen.append(b.at - a.stamp)
        out.status_posts += len([s for s in r.reads.ready[node] if start <= s.at <= end])
    return out


@dataclass(frozen=True)
class Cut:
    name: str
    kind: str  # "blackhole" (packets dropped) or "refused" (the load balancer gone)
    seconds: float
    mark: bool  # half the nodes marked Ready=Unknown half-way, as KCM would


@dataclass
class CutResult:
    cut: Cut
    start: float
    heal: float
    end: float
    marked: list[str]
    connections: dict[str, int] = field(default_factory=dict)  # accepted by its LB during the cut
    log: dict[str, list[KlogLine]] = field(default_factory=dict)  # its log from the cut to the end
    last_before: dict[str, Seen | None] = field(default_factory=dict)
    renewed: dict[str, Seen | None] = field(default_factory=dict)  # first renewal seen after the heal
    ready: dict[str, Seen | None] = field(default_factory=dict)  # first Ready change seen after the heal


def run_cut(r: Rig, cut: Cut, after_s: float) -> CutResult:
    """Every load balancer cut for ``cut.seconds``, then healed; followed until every kubelet
    renewed and every marked node is Ready again (at most ``after_s``)."""
    marked = r.nodes[: len(r.nodes) // 2] if cut.mark else []
    before = {n: p.connections for n, p in r.proxies.items()}
    start = time.time()
    set_cut(r, cut.kind, cut=True)
    if marked:
        time.sleep(cut.seconds / 2)  # the cut's first half
        for node in marked:
            mark_unknown(r.admin, node)
    time.sleep(max(0.0, start + cut.seconds - time.time()))  # the rest of the cut
    connections = {n: p.connections - before[n] for n, p in r.proxies.items()}
    heal = time.time()
    set_cut(r, cut.kind, cut=False)
    eventually(lambda: _recovered(r, heal, marked), after_s)
    out = CutResult(cut, start, heal, time.time(), marked, connections)
    for k in r.kubelets:
        out.log[k.node] = [line for line in k.log() if start <= line.at <= out.end]
        out.last_before[k.node] = next((s for s in reversed(r.reads.leases[k.node]) if s.at <= start), None)
        out.renewed[k.node] = next((s for s in r.reads.leases[k.node] if s.at > heal), None)
        out.ready[k.node] = next((s for s in r.reads.ready[k.node] if s.at > heal), None)
    return out


def _recovered(r: Rig, heal: float, marked: Sequence[str]) -> bool:
    renewed = all(any(s.at > heal for s in r.reads.leases[n]) for n in r.nodes)
    ready = all(any(s.at > heal and s.value.startswith("True ") for s in r.reads.ready[n]) for n in marked)
    return renewed and ready


def failed(result: CutResult, node: str, start: float, end: float) -> list[KlogLine]:
    """The lease requests it logged as failed between ``start`` and ``end``."""
    return [
        line
        for line in result.log[node]
        if start <= line.at <= end and any(m in line.message for m in FAILED_REQUEST)
    ]


def backoffs(result: CutResult) -> str:
    """The back-off waits ensureLease logged, in the order of their first appearance."""
    waits: dict[str, None] = {}
    for lines in result.log.values():
        for line in lines:
            if "Failed to ensure lease exists" in line.message and 'interval="' in line.message:
                waits[line.message.split('interval="')[1].split('"')[0]] = None
    return ", ".join(waits) or "none"


def longest_wait(result: CutResult) -> list[float]:
    """Per node, the longest time between two failed lease requests (or the cut's start and
    the first one)."""
    out = []
    for node in result.log:
        times = [result.start, *(line.at for line in failed(result, node, result.start, result.end))]
        out.append(max((b - a for a, b in itertools.pairwise(times)), default=math.nan))
    return [x for x in out if not math.isnan(x)]


def per_node(result: CutResult) -> dict[str, list[float]]:
    """The per-node figures of one cut, by row label."""
    rows: dict[str, list[float]] = {k: [] for k in _CUT_FIGURES}
    for node in result.log:
        during = failed(result, node, result.start, result.heal)
        rows["failed lease requests during the cut"].append(len(during))
        rows["  of which timed out (10 s heartbeat client timeout)"].append(
            len([x for x in during if any(m in x.message for m in TIMED_OUT)])
        )
        rows["failed lease requests after the heal"].append(
            len(failed(result, node, result.heal, result.end))
        )
        rows["  of which refused dials (its load balancer gone)"].append(
            len([x for x in during if "connection refused" in x.message])
        )
        rows["connections its load balancer accepted during the cut"].append(result.connections[node])
        lost = [x.at for x in result.log[node] if "client connection lost" in x.message]
        if lost:
            rows["dead connection dropped (http2 ping), after the cut began"].append(lost[0] - result.start)
        _recovery(result, node, rows)
    return rows


def _recovery(result: CutResult, node: str, rows: dict[str, list[float]]) -> None:
    before, after, ready = result.last_before[node], result.renewed[node], result.ready[node]
    if after is not None:
        rows["heal -> lease renewed (seen by our read)"].append(after.at - result.heal)
        rows["heal -> renewTime written (node clock)"].append(after.stamp - result.heal)
        if before is not None:
            rows["renewTime gap across the cut"].append(after.stamp - before.stamp)
            due = max(result.heal, before.stamp + MODEL_DUE_S)
            rows["path healed, yet silent to the model past its due"].append(max(0.0, after.at - due))
    if node in result.marked and ready is not None:
        rows["heal -> NodeStatus posted, node marked Unknown"].append(ready.at - result.heal)
    if node not in result.marked:
        rows["NodeStatus posted after the heal, status unchanged (nodes)"].append(int(ready is not None))


_CUT_FIGURES = (
    "failed lease requests during the cut",
    "  of which timed out (10 s heartbeat client timeout)",
    "  of which refused dials (its load balancer gone)",
    "failed lease requests after the heal",
    "connections its load balancer accepted during the cut",
    "dead connection dropped (http2 ping), after the cut began",
    "heal -> lease renewed (seen by our read)",
    "heal -> renewTime written (node clock)",
    "renewTime gap across the cut",
    "path healed, yet silent to the model past its due",
    "heal -> NodeStatus posted, node marked Unknown",
    "NodeStatus posted after the heal, status unchanged (nodes)",
)
_COUNTS = set(_CUT_FIGURES[:5])


def print_steady(s: Steady, nodes: int) -> None:
    jitter = [(x - MODEL_INTERVAL_S) / MODEL_INTERVAL_S * 100 for x in s.intervals]
    print_table(
        f"{nodes} hollow kubelets on a working path for {s.seconds:.0f} s "
        f"({len(s.intervals)} renewal intervals; min / median / max)",
        ["measure", "value"],
        [
            ["renewTime -> next renewTime (the node's clock)", min_median_max(s.intervals, "s", 3)],
            [f"  the same as stretch over {MODEL_INTERVAL_S:g} s", min_median_max(jitter, "%", 2)],
            ["the next renewal as our reads saw it (every 100 ms)", min_median_max(s.seen_intervals, "s", 2)],
            ["renewTime -> first seen by a read", min_median_max(s.landing, "s", 3)],
            [
                f"a renewTime -> the next renewal seen (model: due {MODEL_DUE_S:.1f} s)",
                min_median_max(s.next_seen, "s", 2),
            ],
            ["NodeStatus posts (an unchanged status)", str(s.status_posts)],
            ["RSS per hollow kubelet", min_median_max(s.rss_mib, "MiB")],
            ["CPU per hollow kubelet", min_median_max(s.cpu_ms_per_s, "ms/s")],
        ],
    )


def _cell(label: str, values: list[float], result: CutResult) -> str:
    if label == _CUT_FIGURES[-1]:
        return f"{sum(values):.0f} of {len(values)} in {result.end - result.heal:.0f} s" if values else "-"
    return min_median_max(values, "", 0) if label in _COUNTS else min_median_max(values)


def print_cuts(results: Sequence[CutResult]) -> None:
    figures = [per_node(r) for r in results]
    rows = [
        [label, *(_cell(label, f[label], r) for f, r in zip(figures, results, strict=True))]
        for label in _CUT_FIGURES
    ]
    rows.insert(5, ["back-off waits logged (ensureLease)", *(backoffs(r) for r in results)])
    rows.insert(
        6, ["longest wait between failed requests", *(min_median_max(longest_wait(r)) for r in results)]
    )
    print_table(
        "Every load balancer cut, then healed (per node: min / median / max; marked: half the "
        "nodes set Ready=Unknown half-way, as KCM would)",
        ["measure", *(r.cut.name + (", marked" if r.cut.mark else "") for r in results)],
        rows,
    )


def print_model(s: Steady, results: Sequence[CutResult]) -> None:
    top = MODEL_INTERVAL_S * (1 + KUBELET_JITTER)
    worst = max(s.next_seen, default=math.nan)
    intervals_hold = (
        bool(s.intervals) and MODEL_INTERVAL_S <= min(s.intervals) <= max(s.intervals) <= top + 0.1
    )
    rows = [
        [
            "renewal interval (working path)",
            f"{MODEL_INTERVAL_S:g} s, each wait stretched by up to {KUBELET_JITTER:.0%}: at most {top:.1f} s",
            min_median_max(s.intervals, "s", 3),
            "yes" if intervals_hold else "NO",
        ],
        [
            "a renewal -> the next one visible",
            f"due {MODEL_DUE_S:.1f} s after it (slack {DeciderSettings().witness_slack_s:g} s)",
            f"at most {worst:.2f} s",
            "yes" if worst < MODEL_DUE_S else "NO",
        ],
    ]
    for r in results:
        figures = per_node(r)
        silent = max(figures["path healed, yet silent to the model past its due"], default=math.nan)
        renewed = max(figures["heal -> lease renewed (seen by our read)"], default=math.nan)
        rows.append(
            [
                f"after {r.cut.name}: the path works, no renewal",
                "a kubelet that reaches KAPI renews when due",
                f"{silent:.1f} s past its due (heal -> renewed: {renewed:.1f} s at most)",
                "yes" if silent < MODEL_INTERVAL_S else "NO: a whole interval missed",
            ]
        )
    print_table(
        "The second witness's model of the kubelet (aggregator/decide/witness.py) against the real one",
        ["what", "the model", "measured", "holds"],
        rows,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.kubelet", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--steady-seconds", type=float, default=60.0)
    p.add_argument("--cut-seconds", type=float, default=30.0)
    p.add_argument("--blip-seconds", type=float, default=3.0)
    p.add_argument("--after-seconds", type=float, default=75.0, help="at most this long after each heal")
    args = p.parse_args(argv)
    cuts = [
        Cut(f"blackhole {args.cut_seconds:g} s", "blackhole", args.cut_seconds, mark=True),
        Cut(f"refused {args.cut_seconds:g} s", "refused", args.cut_seconds, mark=True),
        Cut(f"blackhole blip {args.blip_seconds:g} s", "blackhole", args.blip_seconds, mark=False),
    ]
    with tempfile.TemporaryDirectory(prefix="bench-kubelet-") as tmp, rig(args.nodes, Path(tmp)) as r:
        s = steady(r, args.steady_seconds)
        results = [run_cut(r, cut, args.after_seconds) for cut in cuts]
    print(f"\ncommand: python -m bench.kubelet {' '.join(argv or [])}".rstrip())
    print_steady(s, args.nodes)
    print_cuts(results)
    print_model(s, results)


def run() -> None:
    main([])


if __name__ == "__main__":
    main()
