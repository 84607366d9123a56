"""The demo scenario, in two acts on the same cut; the protected act is also the detection
benchmark's.

Two real API servers (shoot and seed), ten nodes each with a real agent process and a real
kubelet (kubemark's hollow node: the kubelet's own code on a fake container runtime) that reach
the shoot's KAPI through a TCP load balancer under an external name, a pod on each node behind a
Service (Running and Ready as the kubelet reports it), the controllers in the seed. The seed's
kube-controller-manager Deployment runs real KCM processes against the shoot (its node lifecycle
controller marks a node Unknown 40 s after its kubelet goes quiet); machine-controller-manager
and cluster-autoscaler are Deployment objects only. The load balancer is cut: every renewal fails,
KAPI itself stays healthy.

Act 1, no protection: the aggregator runs in dry-run (it judges and says what it would do,
writing nothing), so KCM alone decides what the cut means: it marks every node Unknown and
takes their pods' endpoints away. The load balancer comes back and every node is Ready again.

Act 2, protection: the aggregator with its defaults, the same cut. It scales the controllers
down before KCM's grace period ends, and the cut is held past it: no node goes Unknown, no
endpoint is taken away. The load balancer comes back: the controllers come back, each with its
old replicas, and KCM finds every node Ready.

The two acts play at once, each in a world of its own (its API servers, nodes, agents, kubelets
and KCM), and their load balancers are cut at the same moment: the same cut, side by side, in
about half the time of one act after the other (`make demo` cold is mostly the build).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from aggregator.model.observed import KUBELET_LEASE_DURATION_S, KUBELET_RENEW_FRACTION, NODE_LEASE_NAMESPACE
from aggregator.model.records import MELTDOWN, RECORD, REPLICAS
from aggregator.model.settings import DeciderSettings
from core.lease import leases_path, parse_micro_time
from demo import picture as draw
from demo.live import Live
from demo.track import Sample, Track, status_line
from testenv.base.kapi import Client, node_leases
from testenv.base.process import Process, json_log, stop_all
from testenv.base.wait import wait_for
from testenv.kube import workload
from testenv.kube.controllers import CONTROLLERS, DOWN, KCM, MCM
from testenv.kube.controlplane import ControlPlane, ensure_namespace
from testenv.kube.hollow import HollowKubelet
from testenv.kube.kcm import NODE_GRACE_S as GRACE_S
from testenv.kube.kcm import KcmDeploymentController, KcmReplicas
from testenv.kube.kubelet_identity import write_kubeconfig
from testenv.kube.standins import DEPLOYMENTS, deployment, grant_agent_rbac
from testenv.net.tcpproxy import TcpProxy
from testenv.worlds import aggregators
from testenv.worlds.agents import ByKubeconfig, start_agent

# How long after its start the aggregator judges and has read the kubelet leases twice (every
# 10 s): a lease duration of fresh view (6 s), its second read, and two seconds for both.
WARM_S = 12
# How long the demo holds the cut beyond the moment KCM (its grace as Gardener sets it) would
# have acted.
HOLD_PAST_GRACE_S = 10

KUBELET_RENEW_S = KUBELET_LEASE_DURATION_S * KUBELET_RENEW_FRACTION
AGENT_RENEW_S = DeciderSettings().fast_interval_s

NAMESPACE = "shoot--demo--local"
SHOWN_EVENTS = {
    "target_observing",
    "target_phase",
    "scale_down_blocked",
    "resource_scaled_down",
    "resource_scaled_up",
    "target_scale_down",
    "target_scale_up",
}


@dataclass
class Timeline:
    start: float = field(default_factory=time.monotonic)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, what: str) -> float:
        self.marks.setdefault(what, time.monotonic())
        return self.marks[what]

    def since(self, a: str, b: str) -> float:
        return self.marks[b] - self.marks[a]


class Show:
    """Prints what happens, as it happens, and keeps each sample of its world (``track``) for the
    picture; ``label`` says which act's world (both play at once). On a terminal (``live``) a
    sample redraws the board of both worlds instead of printing a line."""

    def __init__(
        self,
        out: TextIO | None,
        timeline: Timeline,
        label: str = "",
        *,
        track: Track | None = None,
        live: Live | None = None,
    ) -> None:
        self.out = out
        self.timeline = timeline
        self.prefix = f"{label:13} | " if label else ""
        self.track = track or Track(label, timeline.marks)
        self.live = live
        self.last_status = ""

    # Both acts print from threads of their own: a line is written whole.
    lock = threading.Lock()

    def __call__(self, text: str) -> None:
        if self.out is None:
            return
        line = f"[{time.monotonic() - self.timeline.start:6.1f}s] {self.prefix}{text}\n"
        if self.live is not None:
            self.live.say(line)
            return
        with self.lock:
            self.out.write(line)
            self.out.flush()

    def sample(self, sample: Sample) -> None:
        """Kept for the picture; shown on the board, or as a line when it differs from the last."""
        self.track.samples.append(sample)
        if self.live is not None:
            self.live.update()
            return
        status = status_line(sample)
        if status != self.last_status:
            self(status)
            self.last_status = status


def lease_ages(admin: Client) -> list[float]:
    now = datetime.now(UTC)
    ages = []
    for lease in node_leases(admin).values():
        renew = lease["spec"].get("renewTime")
        ages.append((now - parse_micro_time(renew)).total_seconds() if renew else float("inf"))
    return ages


class LogTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_events(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        events = []
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events


@dataclass
class World:
    """An act's world (``world``): its API servers, the load balancer the nodes reach the shoot's
    through, KCM's replicas, the nodes' names, and the agents and aggregators started in it
    (``procs``, stopped with it)."""

    shoot: ControlPlane
    seed: ControlPlane
    lb: TcpProxy
    kcm: KcmReplicas
    names: list[str]
    tmp: Path
    shoot_admin: Client
    seed_admin: Client
    procs: list[Process]
    agents: list[Process] = field(default_factory=list)


@contextlib.contextmanager
def world(nodes: int, tmp: Path, show: Show) -> Iterator[World]:
    show("starting the shoot's kube-apiserver + etcd and the seed's (real binaries, loopback only)")
    with ControlPlane().running() as shoot, ControlPlane().running() as seed:
        assert shoot.ca is not None
        host_port = shoot.url.rsplit(":", 1)[1]
        lb = TcpProxy(upstream=("127.0.0.1", int(host_port))).open()
        shoot_admin, seed_admin = shoot.admin_client(), seed.admin_client()
        kcm = KcmReplicas(shoot, tmp / "kcm")
        controller = KcmDeploymentController(seed.admin_client(), NAMESPACE, kcm)
        procs: list[Process] = []
        names = [f"node-{i}" for i in range(nodes)]
        # The kubelets go through the load balancer too: the cut silences them as it does the agents.
        kubelets = [
            HollowKubelet(n, shoot, tmp / "kubelets", server=f"https://localhost:{lb.port}") for n in names
        ]
        try:
            grant_agent_rbac(shoot_admin)
            ensure_namespace(seed_admin, NAMESPACE)
            for name, replicas in CONTROLLERS.items():
                seed_admin.ensure(DEPLOYMENTS.format(ns=NAMESPACE), deployment(name, replicas))
            controller.start()
            _start_spread(kubelets)
            workload.deploy(shoot_admin, names)
            show(
                f"{nodes} nodes (real kubelets: kubemark's hollow node), a pod on each behind a Service; "
                "controllers in the "
                f"seed: {CONTROLLERS}, the kube-controller-manager replicas real KCM processes"
            )
            yield World(shoot, seed, lb, kcm, names, tmp, shoot_admin, seed_admin, procs)
        finally:
            stop_all(procs, 5)
            for k in kubelets:
                k.stop()
            controller.stop()
            lb.shutdown()
            shoot_admin.close()
            seed_admin.close()


def _start_spread(kubelets: list[HollowKubelet]) -> None:
    """Started spread over a kubelet's renew interval, as a cluster's nodes are (each registered
    when its machine came up): started at once, they renew in step, and a cut just after their
    common renewal waits for the second witness until all are due again (13.1 s measured;
    docs/decision.md, "The second witness"). From the world's thread: a process dies with the
    thread that started it."""
    for i, k in enumerate(kubelets):
        if i:
            time.sleep(KUBELET_RENEW_S / len(kubelets))
        k.start()


def start_agents(w: World, tmp: Path, env_base: dict[str, str]) -> None:
    """An agent per node, started spread over a renew interval as a DaemonSet's pods start (the
    kubelets' reason, ``_start_spread``): started at once, they renewed in step, and a cut
    just after their common renewal found every lease a whole interval later to go stale."""
    for i, node in enumerate(w.names):
        if i:
            time.sleep(AGENT_RENEW_S / len(w.names))
        token = tmp / f"{node}.token"
        token.write_text(w.shoot.node_token(node))
        # The node's kubelet kubeconfig, naming the load balancer the kubelets use:
        # the agent takes its server and CA from there, as on a Gardener node.
        kubeconfig = write_kubeconfig(
            tmp / f"kubeconfig-{node}", f"https://localhost:{w.lb.port}", w.shoot.ca_file.read_bytes()
        )
        agent = start_agent(
            node,
            token_file=token,
            server=ByKubeconfig(kubeconfig),
            log_path=tmp / f"agent-{node}{'-successor' if len(w.agents) >= len(w.names) else ''}.log",
            env={**env_base, "DWD_LOG_FORMAT": "json"},
        )
        w.procs.append(agent)
        w.agents.append(agent)


def start_aggregator(
    w: World,
    tmp: Path,
    env_base: dict[str, str],
    overrides: dict[str, str],
    *,
    log_name: str = "aggregator.log",
) -> Process:
    log_path = tmp / log_name
    aggregator = aggregators.start_aggregator(
        {**env_base, "DWD_LOG_FORMAT": "json", **overrides},
        name=log_path.stem,
        log_path=log_path,
        shoot_kubeconfig=w.shoot.kubeconfig,
        seed_kubeconfig=w.seed.kubeconfig,
        namespace=NAMESPACE,
    )
    w.procs.append(aggregator)
    return aggregator


def wait(pred: Callable[[], bool], timeout_s: float, what: str, tick: Callable[[], None]) -> None:
    """``wait_for``, showing what happens meanwhile."""

    def done() -> bool:
        if pred():
            return True
        tick()
        return False

    wait_for(done, timeout_s, f"demo: {what}", every_s=0.25, error=TimeoutError)


def hold(seconds: float, tick: Callable[[], None]) -> None:
    """Wait, but keep showing what happens meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tick()
        time.sleep(0.25)


@dataclass
class Stage:
    """What an act needs: the world, its aggregator's log, and the status line shown as it goes."""

    w: World
    show: Show
    tl: Timeline
    nodes: int
    # Both acts cut their load balancers at the same moment: each waits here for the other.
    together: threading.Barrier | None = None
    # The cut comes as every agent rolls (``--roll``): their successors start at the heal.
    roll: bool = False
    successors: Callable[[], None] | None = None
    tail: LogTail | None = None
    aggregator: Process | None = None
    # From the cut on: the most nodes Unknown at once, the fewest ready endpoints, and when
    # each node was first seen Unknown.
    unknown: int = 0
    min_endpoints: int = 0
    unknown_at: dict[str, float] = field(default_factory=dict)

    def replicas(self) -> dict[str, int]:
        items = self.w.seed_admin.get(DEPLOYMENTS.format(ns=NAMESPACE))["items"]
        return {d["metadata"]["name"]: d["spec"].get("replicas", 1) for d in items}

    def reset(self) -> None:
        self.unknown, self.min_endpoints, self.unknown_at = 0, self.nodes, {}

    def tick(self) -> None:
        for e in self.tail.new_events() if self.tail is not None else ():
            if e.get("event") in SHOWN_EVENTS:
                detail = {k: v for k, v in e.items() if k not in ("event", "timestamp", "level", "target")}
                self.show(f"aggregator: {e['event']} {detail}")
        ages = lease_ages(self.w.shoot_admin)
        replicas = self.replicas()
        o = workload.observe(self.w.shoot_admin)
        self.show.sample(
            Sample(
                at=time.monotonic(),
                leases_renewed=sum(1 for a in ages if a < 4),
                leases=len(ages),
                replicas=replicas,
                kcm_running=self.w.kcm.count(),
                nodes_ready=sum(1 for v in o.nodes.values() if v == "True"),
                nodes_seen=len(o.nodes),
                nodes_unknown=len(o.unknown()),
                endpoints=o.ready_endpoints,
                nodes=self.nodes,
            )
        )
        self.unknown = max(self.unknown, len(o.unknown()))
        self.min_endpoints = min(self.min_endpoints, o.ready_endpoints)
        if "cut" in self.tl.marks:
            for n in o.unknown():
                self.unknown_at.setdefault(n, time.monotonic() - self.tl.marks["cut"])

    def healthy(self, *, renewing: bool = True) -> bool:
        """Every node Ready, every endpoint ready, KCM running and (``renewing``) every agent
        renewing its lease (the aggregator creates them)."""
        o = workload.observe(self.w.shoot_admin)
        renewed = len([a for a in lease_ages(self.w.shoot_admin) if a < 4]) == self.nodes
        ready = list(o.nodes.values()) == ["True"] * self.nodes
        up = ready and o.ready_endpoints == self.nodes and self.w.kcm.ready() >= 1
        return up and (renewed or not renewing)


# An act: what it does on its stage (its world, started), and what it measured.
Act = Callable[[Stage, Path], dict[str, float]]


def run(
    out: TextIO | None = sys.stdout,
    nodes: int = 10,
    overrides: dict[str, str] | None = None,
    *,
    unprotected: bool = True,
    roll: bool = False,
    renewals: list[float] | None = None,
    keep: Path | None = None,
    picture: Path | None = None,
    live: bool | None = None,
) -> dict[str, float]:
    """Runs the scenario: without protection (``unprotected``: the aggregator in dry-run beside
    KCM) and with it, each act in a world of its own, both at once and cut at the same moment;
    returns the measured times in seconds. ``roll``: the cut comes as every agent stops in a roll
    of the DaemonSet whose successors cannot start before the heal. ``renewals`` gets, from act
    1, each kubelet lease's last renewal in seconds from the cut; ``keep`` is a directory for
    the logs and kubeconfigs (kept), else a temporary one; ``picture`` a file for the race drawn
    (demo/picture.py); ``live`` shows a board redrawn in place instead of a line per sample, by
    default where ``out`` is a terminal."""
    start = time.monotonic()
    acts = _acts({"DWD_NODE_GRACE": "0s", **(overrides or {})}, unprotected, renewals)
    with contextlib.ExitStack() as stack:
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        tmp = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dwd-demo-")))
        shows = _shows(out, start, [label for label, _ in acts], live)
        played = [
            (tmp / label.replace(" ", "-"), show, act) for (label, act), show in zip(acts, shows, strict=True)
        ]
        try:
            measured = _play(played, nodes, roll=roll)
        except Exception:
            if keep is None:  # the temporary directory goes: what went wrong is in its logs
                _keep_logs(tmp)
            raise
        finally:
            if shows[0].live is not None:
                shows[0].live.close()
        _tell(
            Show(out, Timeline(start)),
            side_by_side(measured, nodes, roll=roll) if unprotected else "",
            shows,
            picture,
        )
        return measured


def _acts(
    overrides: dict[str, str], unprotected: bool, renewals: list[float] | None
) -> list[tuple[str, Act]]:
    """The acts by their labels: with protection, and before it (``unprotected``) without."""
    env_base = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    acts: list[tuple[str, Act]] = [
        ("protection", lambda stage, tmp: _act_protected(stage, tmp, env_base, overrides)),
    ]
    if unprotected:
        acts.insert(
            0, ("no protection", lambda st, tmp: _act_unprotected(st, tmp, env_base, overrides, renewals))
        )
    return acts


def _tell(show: Show, summary: str, shows: list[Show], picture: Path | None) -> None:
    """The side-by-side summary (if both acts played), and the race drawn into ``picture``."""
    if summary:
        show(summary)
    if picture is not None:
        picture.parent.mkdir(parents=True, exist_ok=True)
        picture.write_text(draw.svg([s.track for s in shows], summary))
        show(f"the race as a picture: {picture.resolve()}")


def _keep_logs(tmp: Path) -> None:
    kept = Path(tempfile.mkdtemp(prefix="dwd-demo-failed-"))
    with contextlib.suppress(shutil.Error):  # sockets are not copied; the logs are
        shutil.copytree(tmp, kept, dirs_exist_ok=True, ignore_dangling_symlinks=True)
    print(f"the demo failed: its logs are kept in {kept}", file=sys.stderr)


def _shows(out: TextIO | None, start: float, labels: list[str], live: bool | None) -> list[Show]:
    """A Show per act, each keeping its world's track; on a terminal (or ``live``) one board
    for them all."""
    timelines = [Timeline(start) for _ in labels]
    tracks = [Track(label, tl.marks) for label, tl in zip(labels, timelines, strict=True)]
    if live is None:
        live = out is not None and out.isatty() and os.environ.get("TERM") != "dumb"
    board = Live(out, tracks) if live and out is not None else None
    prefixed = len(labels) > 1
    return [
        Show(out, tl, track.label if prefixed else "", track=track, live=board)
        for tl, track in zip(timelines, tracks, strict=True)
    ]


def _play(played: list[tuple[Path, Show, Act]], nodes: int, *, roll: bool) -> dict[str, float]:
    """Each act in a thread of its own, from its world's start to its end: the worlds start side
    by side, and a thread's servers live as long as it does (they die with the thread that
    started them). The first failure is raised once both have ended (the other act, waiting
    for the common cut, is released by it)."""
    measured: dict[str, float] = {}
    errors: list[BaseException] = []
    together = threading.Barrier(len(played))

    def play(tmp: Path, show: Show, act: Act) -> None:
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            with world(nodes, tmp, show) as w:
                measured.update(act(Stage(w, show, show.timeline, nodes, together, roll), tmp))
        except BaseException as e:
            errors.append(e)
            together.abort()

    threads = [threading.Thread(target=play, args=one, daemon=True) for one in played]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return measured


def side_by_side(m: dict[str, float], nodes: int, *, roll: bool = False) -> str:
    return (
        f"the same cut{' as every agent rolled' if roll else ''}, side by side: without protection KCM "
        f"marked {m['unprotected_unknown']:.0f} nodes "
        f"Unknown from {m['unprotected_first_unknown_s']:.0f}s on and left "
        f"{m['unprotected_endpoints_min']:.0f}/{nodes} endpoints; with it KCM was at 0 "
        f"{m['cut_to_kcm_written_s']:.1f}s after the cut, "
        f"{m['nodes_unknown_max']:.0f} nodes Unknown, {m['endpoints_ready_min']:.0f}/{nodes} endpoints kept"
    )


def _aggregator(stage: Stage, tmp: Path, env_base: dict[str, str], env: dict[str, str], name: str) -> Path:
    """Start an aggregator and wait for its first healthy verdict; its log is the stage's."""
    stage.aggregator = start_aggregator(stage.w, tmp, env_base, env, log_name=name)
    log_path = stage.aggregator.log_path
    stage.tail = LogTail(log_path)
    stage.show(f"the aggregator started with {env}")
    # The agents after it, as in a running seed: their leases are there (the aggregator
    # creates them) and no agent has backed off from a lease not created yet.
    start_agents(stage.w, tmp, env_base)
    stage.successors = lambda: start_agents(stage.w, tmp, env_base)
    stage.show(f"started {stage.nodes} agents, renewing through the load balancer")
    # The world started as the aggregator did: its nodes turn Ready meanwhile.
    wait(stage.healthy, 90, "every node Ready and every agent renewing its lease", stage.tick)
    stage.show("every node renews its lease through the load balancer")
    wait(
        lambda: any(e.get("phase") == "healthy" for e in json_log(log_path)),
        60,
        "a healthy verdict",
        stage.tick,
    )
    # A cut comes to an aggregator that has been running for a while: judging (a lease duration
    # of fresh view) and with a second read of the kubelet leases, which places each kubelet's
    # renewal between two reads (before it, the second witness waits up to a read longer).
    started = next(e["timestamp"] for e in json_log(log_path) if e.get("event") == "target_observing")
    warm_in = datetime.fromisoformat(started).timestamp() + WARM_S - time.time()
    stage.show(f"the aggregator is healthy; cutting {max(2.0, warm_in):.0f}s from now, once it is warm")
    hold(max(2.0, warm_in), stage.tick)
    return log_path


def _stop_aggregator(stage: Stage) -> None:
    """The act's aggregator stopped (killed if it lingers); its agents go on."""
    assert stage.aggregator is not None
    stage.w.procs.remove(stage.aggregator)
    stage.aggregator.stop(15)
    stage.tail = stage.aggregator = None


def _kcm_written(stage: Stage, cut_wall: datetime) -> float:
    """Seconds from the cut to the aggregator's write of KCM's replicas to 0, by its log."""
    assert stage.aggregator is not None
    at = [
        datetime.fromisoformat(e["timestamp"])
        for e in json_log(stage.aggregator.log_path)
        if e.get("event") == "resource_scaling"
        and e.get("resource") == KCM
        and e.get("replicas_to") == 0
        and datetime.fromisoformat(e["timestamp"]) > cut_wall
    ]
    if not at:
        raise TimeoutError(f"demo: KCM at 0 with no write of it in {stage.aggregator.log_path}")
    return (at[0] - cut_wall).total_seconds()


def _cut(stage: Stage) -> datetime:
    """The load balancer closed: the nodes lose KAPI, KAPI itself is fine. Returns when, on the
    wall clock (the leases' renewTimes are on it)."""
    if stage.together is not None:
        stage.together.wait(120)
    if stage.roll:
        _roll(stage)
    stage.show(">>> cutting the load balancer: nodes cannot reach KAPI; KAPI itself is fine")
    stage.w.lb.close()
    stage.reset()
    stage.tl.mark("cut")
    return datetime.now(UTC)


def _roll(stage: Stage) -> None:
    """Every agent stopped at once, as a DaemonSet roll at maxUnavailable 100 % stops them: each
    releases its lease (it stops on purpose) and exits; no successor starts before the heal."""
    stage.show(">>> rolling every agent: each releases its lease and stops; no successor can start yet")
    running = [a for a in stage.w.agents if a.alive()]
    for agent in running:
        agent.popen.send_signal(signal.SIGTERM)
    for agent in running:
        agent.wait(10)
    stage.tl.mark("roll")


def _heal(stage: Stage) -> None:
    """The load balancer back, and after a roll the successors starting (their image pulled)."""
    stage.show(">>> the load balancer is back")
    stage.w.lb.open()
    stage.tl.mark("heal")
    if stage.roll and stage.successors is not None:
        stage.successors()
        stage.show(f"the roll goes on: {stage.nodes} successor agents started")


def _kcm_alone(stage: Stage) -> list[float]:
    """What KCM does to the cut by itself: when (seconds after the cut) each node went Unknown."""
    nodes = stage.nodes

    def every_node_unknown() -> bool:
        return stage.unknown == nodes and stage.min_endpoints == 0

    # A kubelet renews every 10 s, KCM judges every 5 s after a 40 s grace: every node Unknown
    # within 55 s of the cut, and the endpoints go with their nodes.
    with contextlib.suppress(TimeoutError):
        wait(every_node_unknown, GRACE_S + 25, "every node Unknown", stage.tick)
    unknown_at = sorted(stage.unknown_at.values())
    if unknown_at:
        first, last = unknown_at[0], unknown_at[-1]
        stage.show(
            f"unprotected: KCM marked {len(unknown_at)} nodes Unknown {first:.0f}-{last:.0f}s after the cut "
            f"and removed {nodes - stage.min_endpoints} of {nodes} endpoints"
        )
    else:
        stage.show(f"unprotected: no node went Unknown within {GRACE_S + 25}s of the cut")
    return unknown_at


def _kubelet_renewals(stage: Stage, cut_wall: datetime) -> list[float]:
    """Each kubelet lease's last renewal, in seconds from the cut: what KCM judged, for a model of
    another rule on the same observations (bench/race.py)."""
    leases = stage.w.shoot_admin.get(leases_path(NODE_LEASE_NAMESPACE))["items"]
    return [
        (parse_micro_time(renew) - cut_wall).total_seconds()
        for lease in leases
        if (renew := lease["spec"].get("renewTime"))
    ]


def _act_unprotected(
    stage: Stage,
    tmp: Path,
    env_base: dict[str, str],
    overrides: dict[str, str],
    renewals: list[float] | None,
) -> dict[str, float]:
    """Act 1: the aggregator in dry-run (it judges and says what it would do, writes nothing);
    KCM alone decides what a cut means."""
    show, nodes = stage.show, stage.nodes
    show(">>> act 1, no protection: the aggregator in dry-run, KCM alone")
    _aggregator(stage, tmp, env_base, {**overrides, "DWD_DRY_RUN": "true"}, "aggregator-dry-run.log")
    cut_wall = _cut(stage)
    unknown_at = _kcm_alone(stage)
    if renewals is not None:
        renewals += _kubelet_renewals(stage, cut_wall)
    _heal(stage)
    # The real kubelet may write into a connection the cut left dead for up to 42 s after the
    # heal (docs/measured.md); on a loaded machine three of ten took more than 90 s once.
    wait(stage.healthy, 150, "every node Ready and every endpoint back", stage.tick)
    show(f"every node Ready again, {nodes}/{nodes} endpoints")
    _stop_aggregator(stage)
    return {
        "unprotected_first_unknown_s": unknown_at[0] if unknown_at else math.inf,
        "unprotected_last_unknown_s": unknown_at[-1] if unknown_at else math.inf,
        "unprotected_unknown": float(len(unknown_at)),
        "unprotected_endpoints_min": float(stage.min_endpoints),
    }


def _scaled_down(stage: Stage, cut_wall: datetime) -> dict[str, float]:
    """MCM first, then every controller at 0; measured from the cut and from the last renewal:
    as seen by the demo's polling, and as the aggregator logged KCM's write (a poll is late by
    up to its own round of requests)."""
    tl, replicas = stage.tl, stage.replicas
    wait(lambda: replicas().get(MCM) == 0, 120, "MCM scaled down", stage.tick)
    tl.mark("mcm_down")
    mcm_down_wall = datetime.now(UTC)
    wait(lambda: replicas() == DOWN, 60, "every controller scaled down", stage.tick)
    tl.mark("all_down")
    all_down_wall = datetime.now(UTC)
    last_renewal = max(
        parse_micro_time(lease["spec"]["renewTime"]) for lease in node_leases(stage.w.shoot_admin).values()
    )
    written = _kcm_written(stage, cut_wall)
    stage.show(
        f"protected: MCM down {tl.since('cut', 'mcm_down'):.1f}s and KCM down "
        f"{tl.since('cut', 'all_down'):.1f}s after the cut (KCM's replicas written 0 at "
        f"{written:.1f}s, the aggregator's log; KCM's node grace period is 40-50s)"
    )
    return {
        "cut_to_kcm_written_s": written,
        "last_renewal_to_mcm_down_s": (mcm_down_wall - last_renewal).total_seconds(),
        "last_renewal_to_kcm_down_s": (all_down_wall - last_renewal).total_seconds(),
        "cut_to_mcm_down_s": tl.since("cut", "mcm_down"),
        "cut_to_all_down_s": tl.since("cut", "all_down"),
    }


def _hold_past_grace(stage: Stage) -> None:
    """The cut kept on past KCM's grace: with no KCM running, nothing marks a node Unknown."""
    wait(lambda: stage.w.kcm.count() == 0, 30, "no KCM process left", stage.tick)
    stage.tl.mark("kcm_stopped")
    held = GRACE_S + HOLD_PAST_GRACE_S - stage.tl.since("cut", "kcm_stopped")
    stage.show(f">>> holding the cut {held:.0f}s more: past KCM's {GRACE_S}s grace, no KCM is there to act")
    hold(held, stage.tick)


def _restored(stage: Stage) -> None:
    """The load balancer back: every controller back at its old replicas, no record left."""
    tl, nodes, replicas = stage.tl, stage.nodes, stage.replicas
    _heal(stage)
    wait(lambda: replicas() == CONTROLLERS, 180, "every controller back with its old replicas", stage.tick)
    tl.mark("all_up")
    wait(lambda: stage.w.kcm.ready() >= 1, 60, "KCM running again", stage.tick)
    stage.show(
        f"protected: KCM at 0 {tl.since('cut', 'all_down'):.0f}s after the cut; at most {stage.unknown} "
        f"nodes Unknown, {stage.min_endpoints}/{nodes} endpoints kept; all restored "
        f"{tl.since('heal', 'all_up'):.0f}s after the heal"
    )
    # The record goes once the controller has followed its replicas (the aggregator's next look
    # at it): waited for, at most a few ticks; what is left then is shown, and a test fails on it.
    with contextlib.suppress(TimeoutError):
        wait(lambda: not _carrying_a_record(stage), 30, "every record cleared", stage.tick)
    leftover = _carrying_a_record(stage)
    stage.show(f"restored {replicas()}; controllers still carrying a record: {len(leftover)}")


def _carrying_a_record(stage: Stage) -> list[str]:
    """The controllers that still carry a scale-down record of the aggregator or of
    dependency-watchdog."""
    marks = (RECORD, REPLICAS, MELTDOWN)
    items = stage.w.seed_admin.get(DEPLOYMENTS.format(ns=NAMESPACE))["items"]
    return [d["metadata"]["name"] for d in items if set(d["metadata"].get("annotations") or {}) & set(marks)]


def _act_protected(
    stage: Stage, tmp: Path, env_base: dict[str, str], overrides: dict[str, str]
) -> dict[str, float]:
    """Act 2: the same cut with the aggregator acting."""
    stage.show(">>> act 2, protection: the aggregator with its defaults")
    _aggregator(stage, tmp, env_base, overrides, "aggregator.log")
    cut_wall = _cut(stage)
    measured = _scaled_down(stage, cut_wall)
    _hold_past_grace(stage)
    _restored(stage)
    return {
        **measured,
        "heal_to_all_up_s": stage.tl.since("heal", "all_up"),
        "nodes_unknown_max": float(stage.unknown),
        "endpoints_ready_min": float(stage.min_endpoints),
    }
