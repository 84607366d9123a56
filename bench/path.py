"""A slow path against a broken one, measured: renewals through a load balancer with added
round-trip time, and through a lossy link, at the agent's and the aggregator's default timings.

    python -m bench.path [--rtt-ms 0,150,300,600,1000] [--rtt-seconds 60]
                         [--loss-percent 20,40,50] [--loss-seconds 120] [--nodes 10]

Runs as root (network namespaces, iptables). The rig is testenv/worlds/chain.py:
real agents in namespaces behind a DNS server and a load balancer each, the
real aggregator on the internal address, a shoot and a seed API server.

Added RTT: every node's load balancer adds the round trip for the whole level,
and cuts its connections once half-way, so each agent also pays a new
connection through the slow path. Loss: iptables drops that share of the
packets between every node and its load balancer, in each direction. Between
levels everything is healed and the aggregator must be judging every node
healthy again.

Where each figure comes from:
- renewals ok / attempted: the agents' own counters (dwd_agent_renewals_total and
  dwd_agent_failures_total), read before and after the level over a path no fault touches;
- renewal time: from the renewTime an agent wrote (the start of its attempt) to the line
  it logs on the answer, both on this machine's clock; a renewTime that landed but whose
  answer came after the agent gave up is "landed unacknowledged";
- longest renewTime gap: the leases listed every 100 ms through the admin client on loopback;
  "went back" counts an older renewTime landing after a newer one (a request the agent had
  given up on, retransmitted by TCP and delivered after its retry);
- stale and longest age: the aggregator's /status every 200 ms (what its verdict counts,
  and how long it saw each lease go unrenewed on its own clock);
- scaled down: the controllers read from the seed every 100 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from bench.tools.stats import percentile
from bench.tools.table import Column, print_columns, print_table
from testenv.base.wait import wait_for
from testenv.kube.controllers import CONTROLLERS
from testenv.kube.controlplane import ControlPlane
from testenv.net import netns
from testenv.worlds.chain import AGGREGATOR_DEFAULTS, Chain, agent_counters, agent_record, chain, latencies


@dataclass(frozen=True)
class Level:
    name: str
    seconds: float
    attempted: int
    failed: int
    failures_by_class: dict[str, int]
    took: list[float]
    unacknowledged: int
    longest_gap_s: float
    max_stale: int
    longest_age_s: float
    scaled_down: bool
    went_back: int  # an older renewTime landed after a newer one

    @property
    def broken(self) -> bool:
        """As the aggregator judged it: a lease counted stale, or the controllers scaled down."""
        return self.max_stale > 0 or self.scaled_down

    @property
    def ok_ratio(self) -> str:
        ok = self.attempted - self.failed
        return f"{ok}/{self.attempted} ({ok / self.attempted:.1%})" if self.attempted else "-"


def ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.0f}"


def counters(c: Chain) -> dict[str, dict[str, float]]:
    return {n.name: agent_counters(n) for n in c.nodes}


def measure(
    c: Chain, name: str, seconds: float, fault: Callable[[], None], heal: Callable[[], None]
) -> Level:
    """One level: the fault for ``seconds`` (``fault`` may itself sleep part of it), then healed."""
    c.wait_judging(120)
    before = counters(c)
    went_back = c.leases.regressions
    t0 = time.time()
    fault()
    time.sleep(max(0.0, t0 + seconds - time.time()))
    t1 = time.time()
    heal()
    after = counters(c)
    took: list[float] = []
    unacknowledged = 0
    by_class: dict[str, int] = {}
    for node in c.nodes:
        t, u = latencies(c.leases.between(node.name, t0, t1), agent_record(node, t0, t1).renewed)
        took += t
        unacknowledged += u
        for key, value in after[node.name].items():
            if key.startswith("dwd_agent_failures_total"):
                cls = key.split('"')[1]
                by_class[cls] = by_class.get(cls, 0) + int(value - before[node.name].get(key, 0.0))
    renewed = sum(int(after[n]["renewals"] - before[n]["renewals"]) for n in after)
    failed = sum(int(after[n]["failures"] - before[n]["failures"]) for n in after)
    views = c.view.between(t0, t1)
    return Level(
        name,
        t1 - t0,
        renewed + failed,
        failed,
        {k: v for k, v in sorted(by_class.items()) if v},
        took,
        unacknowledged,
        max(c.leases.max_gap(n.name, t0, t1) for n in c.nodes),
        max((v.stale for v in views), default=-1),
        max(c.view.max_age(n.name, t0, t1) for n in c.nodes),
        c.scaled_down_since(t0),
        c.leases.regressions - went_back,
    )


def delay(c: Chain, seconds: float) -> None:
    for lb in c.lbs:
        lb.delay_s = seconds


def loss(c: Chain, share: float) -> None:
    for node in c.nodes:
        node.set_loss(share)


def blackhole(c: Chain, on: bool) -> None:
    for lb in c.lbs:
        lb.blackhole = on


def dns_drop(c: Chain, share: float) -> None:
    c.dns.drop = share


def rtt_levels(c: Chain, rtts_ms: Sequence[int], seconds: float) -> list[Level]:
    out = []
    for rtt in rtts_ms:

        def slow(rtt: int = rtt) -> None:
            delay(c, rtt / 1000)
            time.sleep(seconds / 2)
            c.cut_connections()

        out.append(measure(c, f"+{rtt} ms", seconds, slow, lambda: delay(c, 0.0)))
        print(f"  RTT {out[-1].name}: {out[-1].ok_ratio} ok, max stale {out[-1].max_stale}", flush=True)
    return out


def loss_levels(c: Chain, percents: Sequence[int], seconds: float) -> list[Level]:
    out = []
    for pct in percents:
        out.append(measure(c, f"{pct} %", seconds, functools.partial(loss, c, pct / 100), lambda: loss(c, 0)))
        print(f"  loss {out[-1].name}: {out[-1].failed} failed, max stale {out[-1].max_stale}", flush=True)
    return out


def fault_levels(c: Chain, half_open_s: Sequence[float], seconds: float) -> list[Level]:
    """Short faults a working path recovers from, each observed for ``seconds``: the load
    balancer half-open for a moment (the connections open then stay dead: each agent must give
    up on its attempt and connect anew), DNS failing while the connections stay up, and DNS
    losing half its answers while every connection must be made again (the agent resolves the
    name for each one)."""
    out = []
    for blip in half_open_s:

        def half_open(blip: float = blip) -> None:
            blackhole(c, True)
            time.sleep(blip)
            blackhole(c, False)

        out.append(measure(c, f"load balancer half-open {blip:g} s", seconds, half_open, lambda: None))

    def dns_flaky() -> None:
        dns_drop(c, 0.5)
        end = time.time() + seconds
        while time.time() < end - 10:
            c.cut_connections()
            time.sleep(10)

    out.append(
        measure(
            c, "DNS failing, connections kept", seconds, lambda: dns_drop(c, 1.0), lambda: dns_drop(c, 0.0)
        )
    )
    out.append(
        measure(c, "DNS 50 % lost, connections cut every 10 s", seconds, dns_flaky, lambda: dns_drop(c, 0.0))
    )
    for level in out:
        print(f"  {level.name}: {level.ok_ratio} ok, max stale {level.max_stale}", flush=True)
    return out


@dataclass(frozen=True)
class Detection:
    """A real cut (the load balancers refuse): how soon the controllers go down."""

    first_down_s: float
    all_down_s: float


def detect(c: Chain) -> Detection:
    c.wait_judging(120)
    t0 = time.monotonic()
    for lb in c.lbs:
        lb.close()

    def down(all_of_them: bool) -> float | None:
        if (latest := c.replicas.latest()) is None or latest.t < t0:
            return None  # not one sample since the cut: between() would call the window unseen
        for sample in c.replicas.between(t0):
            low = [n for n, r in sample.replicas.items() if r < CONTROLLERS[n]]
            if (len(low) == len(CONTROLLERS)) if all_of_them else low:
                return sample.t - t0
        return None

    all_down = wait_for(lambda: down(True), 60, "every controller scaled down after the cut", every_s=0.1)
    first = down(False)
    assert first is not None
    for lb in c.lbs:
        lb.open()
    return Detection(first, all_down)


OK: Column[Level] = ("renewals ok / attempted", lambda x: x.ok_ratio)
P50: Column[Level] = ("p50 ms", lambda x: ms(percentile(x.took, 0.5)))
P99: Column[Level] = ("p99 ms", lambda x: ms(percentile(x.took, 0.99)))
BY_CLASS: Column[Level] = (
    "failures by class",
    lambda x: ", ".join(f"{k} {v}" for k, v in x.failures_by_class.items()) or "-",
)
SCALED: Column[Level] = ("scaled down", lambda x: "yes" if x.scaled_down else "no")
RTT: Sequence[Column[Level]] = (
    ("added RTT", lambda x: x.name),
    OK,
    P50,
    P99,
    ("max ms", lambda x: ms(max(x.took, default=math.nan))),
    ("landed unacknowledged", lambda x: x.unacknowledged),
    BY_CLASS,
    ("max stale", lambda x: x.max_stale),
    ("longest age seen, s", lambda x: f"{x.longest_age_s:.1f}"),
    SCALED,
    ("judged", lambda x: "BROKEN" if x.broken else "fine"),
)
LOSS: Sequence[Column[Level]] = (
    ("loss", lambda x: x.name),
    OK,
    ("failed renewals", lambda x: x.failed),
    BY_CLASS,
    P50,
    P99,
    ("longest renewTime gap, s", lambda x: f"{x.longest_gap_s:.1f}"),
    ("renewTime went back", lambda x: x.went_back),
    ("max stale at once", lambda x: x.max_stale),
    SCALED,
)


def print_rtt(levels: list[Level]) -> None:
    seconds = levels[0].seconds if levels else 0
    print_columns(
        f"Renewals against added RTT ({len(levels)} levels of "
        f"{seconds:.0f}s, load balancer connections cut half-way)",
        RTT,
        levels,
    )
    first = next((x.name for x in levels if x.broken), None)
    print(f"\nFirst added RTT judged broken: {first or 'none of these'}")


def print_loss(levels: list[Level]) -> None:
    seconds = levels[0].seconds if levels else 0
    print_columns(
        f"Loss soak: random loss each way between every node and its load balancer, {seconds:.0f}s per level",
        LOSS,
        levels,
    )


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM unwinds like ^C, so the rules and namespaces are removed on the way out."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class Run:
    """Every level under one set of the aggregator's settings."""

    settings: dict[str, str]
    rtt: list[Level]
    loss: list[Level]
    faults: list[Level]
    detection: Detection | None

    @property
    def label(self) -> str:
        shown = {**AGGREGATOR_DEFAULTS, **self.settings}
        return f"lease {shown['DWD_LEASE_DURATION']}, confirm {shown['DWD_CONFIRM_PERIOD']}"


def run_one(settings: dict[str, str], levels: Levels, nodes: int) -> Run:
    with (
        tempfile.TemporaryDirectory(prefix="dwd-bench-path-") as tmp,
        ControlPlane().running() as seed,
        chain(seed, Path(tmp), "shoot--bench--path", nodes, settings=settings) as c,
    ):
        print(f"bench.path: {nodes} nodes, settings {settings or 'the defaults'}, logs in {tmp}", flush=True)
        rtt = rtt_levels(c, levels.rtts_ms, levels.rtt_seconds)
        loss = loss_levels(c, levels.loss_percents, levels.loss_seconds)
        faults = fault_levels(c, levels.half_open_s, levels.fault_seconds) if levels.faults else []
        detection = detect(c) if levels.detect else None
    return Run(settings, rtt, loss, faults, detection)


@dataclass(frozen=True)
class Levels:
    rtts_ms: Sequence[int] = (0, 150, 300, 600, 1000)
    rtt_seconds: float = 60.0
    loss_percents: Sequence[int] = (20, 40, 50)
    loss_seconds: float = 120.0
    half_open_s: Sequence[float] = (2.0, 4.0)
    fault_seconds: float = 60.0
    faults: bool = True
    detect: bool = True


def run(levels: Levels = Levels(), variants: Sequence[dict[str, str]] = ({},), nodes: int = 10) -> None:
    why = netns.available()
    if why:
        print(f"\nbench.path skipped: {why}")
        return
    started = time.monotonic()
    with sigterm_interrupts():
        runs = [run_one(settings, levels, nodes) for settings in variants]
    for r in runs:
        print(f"\n=== aggregator: {r.label} ===")
        if r.rtt:
            print_rtt(r.rtt)
        if r.loss:
            print_loss(r.loss)
    print_side_by_side(runs)
    print(f"\nbench.path took {time.monotonic() - started:.0f}s")


def print_side_by_side(runs: list[Run]) -> None:
    """Each level under each setting: what the aggregator counted stale at most, the longest
    it saw a lease unrenewed, and whether anything was scaled down (on a path that works,
    a false scale-down); then a real cut's detection."""
    columns = ["level"]
    for r in runs:
        columns += [f"{r.label}: max stale", "longest age, s", "scaled down"]
    rows = []
    for i, level in enumerate([*runs[0].rtt, *runs[0].loss, *runs[0].faults]):
        row: list[object] = [level.name if not level.name[0].isdigit() else f"loss {level.name}"]
        for r in runs:
            x = [*r.rtt, *r.loss, *r.faults][i]
            row += [x.max_stale, f"{x.longest_age_s:.1f}", "YES (false)" if x.scaled_down else "no"]
        rows.append(row)
    for what, pick in (("cut -> first controller down, s", 0), ("cut -> every controller down, s", 1)):
        row = [what]
        for r in runs:
            d = r.detection
            row += [f"{(d.first_down_s, d.all_down_s)[pick]:.1f}" if d else "-", "", ""]
        rows.append(row)
    print_table(f"The same paths, side by side ({len(runs)} settings)", columns, rows)


def _numbers(kind: type[float]) -> Callable[[str], list[float]]:
    """A comma-separated list of ``kind`` ('' for none)."""
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def _settings(text: str) -> dict[str, str]:
    """``DWD_LEASE_DURATION=6s,DWD_CONFIRM_PERIOD=3s``: the aggregator's settings for a run."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    bad = [item for item in pairs if len(item) != 2 or not item[0].startswith("DWD_")]
    if bad:
        raise argparse.ArgumentTypeError(f"not NAME=VALUE with a DWD_ name: {bad}")
    return {k.strip(): v.strip() for k, v in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.path", description=__doc__.split("\n\n")[0])
    d, add = Levels(), parser.add_argument
    add(
        "--rtt-ms",
        dest="rtts_ms",
        type=_numbers(int),
        default=d.rtts_ms,
        help="added RTT levels (default %(default)s; '' for none)",
    )
    add("--rtt-seconds", type=float, default=d.rtt_seconds, help="per RTT level (default %(default)s)")
    add(
        "--loss-percent",
        dest="loss_percents",
        type=_numbers(int),
        default=d.loss_percents,
        help="loss levels, each way (default %(default)s; '' for none)",
    )
    add("--loss-seconds", type=float, default=d.loss_seconds, help="per loss level (default %(default)s)")
    add(
        "--half-open-s",
        type=_numbers(float),
        default=d.half_open_s,
        help="half-open blips, seconds (default %(default)s)",
    )
    add(
        "--fault-seconds",
        type=float,
        default=d.fault_seconds,
        help="each short fault observed for (default %(default)s)",
    )
    add("--no-faults", dest="faults", action="store_false", help="no half-open or DNS levels")
    add("--no-detect", dest="detect", action="store_false", help="no real cut at the end")
    add(
        "--against",
        type=_settings,
        action="append",
        default=[],
        help="also run every level with these aggregator settings, side by side with the defaults "
        "(e.g. DWD_LEASE_DURATION=6s,DWD_CONFIRM_PERIOD=3s); repeatable",
    )
    add("--nodes", type=int, default=10, help="nodes, each with its agent (default %(default)s)")
    args = parser.parse_args()
    levels = Levels(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Levels)})
    run(levels, [{}, *args.against], args.nodes)


if __name__ == "__main__":
    main()
