"""``dwd-lease-aggregator``: protect shoots' nodes from a meltdown when the path to their KAPI breaks.

``dwd-lease-aggregator status --url URL`` prints a running aggregator's status as a table.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.client
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvloop

from aggregator.extension.delivery import ShootPart
from aggregator.extension.reconciler import Reconciler
from aggregator.extension.source import ExtensionSource
from aggregator.fleet import Fleet
from aggregator.kube.client import KubeApi, KubeClient
from aggregator.kube.endpoint import Endpoint, KubeconfigSource, in_cluster
from aggregator.kube.ratelimit import RateLimit
from aggregator.lead.leader import LeaderElector
from aggregator.lead.scope import Alone, Leadership
from aggregator.lead.shards import Shards
from aggregator.model.dependents import DEFAULT_DEPENDENTS, Dependent, load_dependents
from aggregator.model.settings import MAX_SHARDS, Settings, ShootSettings
from aggregator.observe.seeddependents import SeedDependents
from aggregator.observe.sources import EnvSource, FileSource, GardenerSource, TargetSource, TargetSpec
from aggregator.ops.heap import Heap
from aggregator.ops.looplag import LoopLag
from aggregator.ops.metrics import AggregatorMetrics
from aggregator.ops.server import make_app, render_table, serve
from aggregator.shoot import Shared
from core import cli, logs
from core.errors import ConfigError, KubeconfigError, KubeError

log = logs.get("aggregator")


def source_for(settings: Settings, seed: KubeApi) -> TargetSource:
    shoots = settings.shoots
    if shoots.mode == "extension":
        return ExtensionSource(seed, settings)
    if shoots.mode == "file":
        return FileSource(shoots.file, shoots.kubeconfig_secret)
    if shoots.mode == "gardener":
        return GardenerSource(seed, shoots.kubeconfig_secret, settings.watching)
    return EnvSource(TargetSpec(shoots.namespace, shoots.namespace, kubeconfig_path=shoots.shoot_kubeconfig))


# The Events' own pace, in the spirit of client-go's event broadcaster, which sends from a
# queue of its own behind a spam filter (burst 25 per object) and drops what its queue cannot
# hold: an Event that would wait longer than a minute is dropped and logged (event_failed).
EVENTS_QPS, EVENTS_BURST, EVENTS_MAX_WAIT_S = 25.0, 25, 60.0


@dataclass(frozen=True)
class SeedClients:
    """The seed's clients, a pool each. In a seed-wide incident hundreds of targets write at
    once; sharing their connections, the leader's renewal waited behind them (10.8 s at 200
    targets and 100 ms) and lost the term in the middle of the scale-down. A watch holds its
    connection for as long as it runs: on the targets' pool it would hold one of theirs. And
    750 Events, one per scaled dependent, sent on the targets' 16 connections, were queued with
    the scale writes of the same outage (bench/seed.py)."""

    # Scale writes, records, Machines: sized for every target of a seed writing at once.
    targets: KubeClient
    election: KubeClient
    watches: KubeClient  # Clusters, kubeconfig Secrets, the dependents
    # Reports: a few connections at a rate of their own, drained beside the writes and after
    # them, never in their way: at 25/s an outage of 250 targets spreads its 750 Events over
    # 30 s instead of the 4 s its writes take. A single target's go at once (the burst).
    events: KubeClient

    @classmethod
    def of(cls, endpoint: Callable[[], Endpoint]) -> SeedClients:
        return cls(
            KubeClient(endpoint, connections=64),
            # Every shard Lease and the member Lease renewed at once, beside the LIST.
            KubeClient(
                endpoint, user_agent="dwd-lease-aggregator/leader-election", connections=MAX_SHARDS + 4
            ),
            KubeClient(endpoint, user_agent="dwd-lease-aggregator/seed-watch"),
            KubeClient(
                endpoint,
                user_agent="dwd-lease-aggregator/events",
                connections=8,
                rate=RateLimit(EVENTS_QPS, EVENTS_BURST, max_wait_s=EVENTS_MAX_WAIT_S),
            ),
        )

    async def close(self) -> None:
        for client in (self.targets, self.election, self.watches, self.events):
            await client.close()


@dataclass(frozen=True)
class Election:
    """Who acts: one leader Lease, shard Leases (aggregator/lead/shards.py), or neither (a single
    replica, which always leads)."""

    elector: LeaderElector | None = None
    shards: Shards | None = None
    _alone: Alone = field(default_factory=Alone)

    @classmethod
    def of(cls, settings: Settings, seed: KubeApi) -> Election:
        leader = settings.leader
        if not leader.enabled:
            return cls()
        if leader.shards > 1:
            return cls(shards=Shards(seed, leader, leader.shards))
        return cls(elector=LeaderElector(seed, leader))

    @property
    def leadership(self) -> Leadership:
        """Who acts for which target: the shards, the leader Lease, or this replica alone."""
        return self.shards or self.elector or self._alone

    def is_leader(self) -> bool:
        """Leads at least one target (with shards: one shard)."""
        return self.leadership.leading()

    @property
    def identity(self) -> str:
        return next((e.identity for e in (self.elector, self.shards) if e is not None), os.uname().nodename)

    def tasks(self) -> list[asyncio.Task[None]]:
        named = (("leader-election", self.elector), ("shards", self.shards))
        return [asyncio.create_task(e.run(), name=name) for name, e in named if e is not None]

    async def release(self) -> None:
        for giving_up in (self.elector, self.shards):
            if giving_up is not None:
                await asyncio.shield(giving_up.release())


def _metrics(settings: Settings, election: Election) -> AggregatorMetrics:
    metrics = AggregatorMetrics()
    metrics.dry_run.set(1 if settings.scaling.dry_run else 0)
    if (shards := election.shards) is not None:
        metrics.shards_held.set_function(lambda: float(len(shards.held())))
    metrics.leader.set_function(lambda: 1.0 if election.is_leader() else 0.0)
    return metrics


def _status(
    settings: Settings, election: Election, fleet: Fleet, source: TargetSource, lag: LoopLag
) -> dict[str, Any]:
    return {
        "identity": election.identity,
        "leader": election.is_leader(),
        "dry_run": settings.scaling.dry_run,
        "failure_fraction": settings.decider.failure_fraction,
        "lease_duration_s": settings.decider.lease_duration_s,
        "source_error": fleet.source_error,
        "loop_lag": lag.snapshot(),
        "shards": None if election.shards is None else election.shards.snapshot(),
        "skipped": getattr(source, "skipped", {}),
        "targets": fleet.snapshot(),
    }


async def run(settings: Settings, dependents: tuple[Dependent, ...]) -> None:
    shoots = settings.shoots
    endpoint = KubeconfigSource(shoots.seed_kubeconfig) if shoots.seed_kubeconfig else in_cluster
    clients = SeedClients.of(endpoint)
    try:
        endpoint()  # credentials we cannot even load stop start-up; an unreachable server is retried
    except KubeconfigError as e:
        where = "DWD_SEED_KUBECONFIG" if shoots.seed_kubeconfig else "in-cluster (DWD_SEED_KUBECONFIG unset)"
        raise ConfigError([f"{where}: {e}"]) from None
    election = Election.of(settings, clients.election)
    metrics = _metrics(settings, election)
    heap = Heap()
    lag = LoopLag(observe=metrics.loop_lag.observe)
    shared = Shared(
        settings,
        clients.targets,
        dependents,
        metrics,
        watched=SeedDependents(clients.watches, dependents, settings.watching),
        events=clients.events,
        lag_since=lag.worst_since,
    )
    fleet = Fleet(shared, leadership=election.leadership, watches=clients.watches, on_change=heap.changed)
    source = source_for(settings, clients.watches)
    if isinstance(source, FileSource):
        try:  # a file that is bad at start stops it; one that breaks later keeps the last good set
            await source.desired()
        except KubeError as e:
            raise ConfigError([f"DWD_TARGETS: {e}"]) from None
    runner = None
    if settings.serving.metrics_addr is not None:
        status = functools.partial(_status, settings, election, fleet, source, lag)
        app = make_app(metrics.registry, status, fleet.unready)
        runner = await serve(app, *settings.serving.metrics_addr)
    dry_run = settings.scaling.dry_run
    log.info("aggregator_started", identity=election.identity, targets=shoots.mode, dry_run=dry_run)
    tasks = [
        asyncio.create_task(fleet.run(source), name="fleet"),
        asyncio.create_task(lag.run(), name="loop-lag"),
        asyncio.create_task(heap.run(), name="heap"),
    ]
    if isinstance(source, ExtensionSource):  # the Extension contract, by the same leader
        reconciler = _reconciler(shared, fleet, source, _shoot_part(shoots))
        tasks.append(asyncio.create_task(reconciler.run(), name="extensions"))
    try:
        await _until_stopped(tasks, election)
    finally:
        if runner is not None:
            await runner.cleanup()
        await clients.close()


def _reconciler(shared: Shared, fleet: Fleet, source: ExtensionSource, part: ShootPart | None) -> Reconciler:
    """The Extension contract's writer: the fleet's seed client, dependents and leadership."""
    return Reconciler(
        shared.seed,
        source,
        shared.settings,
        shared.dependents,
        served=fleet.served,
        part=part,
        health_of=fleet.health_of,
        heartbeat_ns=shared.settings.leader.namespace,
        leadership=fleet.leadership,
    )


def _shoot_part(shoots: ShootSettings) -> ShootPart | None:
    """What the extension delivers into every shoot; a file that is not that stops start-up."""
    if not shoots.shoot_objects:
        log.info("shoot_part_not_delivered", reason="DWD_SHOOT_OBJECTS is empty")
        return None
    return ShootPart.load(shoots.shoot_objects, shoots.kubeconfig_secret, shoots.agent_image)


async def _until_stopped(tasks: list[asyncio.Task[None]], election: Election) -> None:
    """Run ``tasks`` and the election until SIGTERM or SIGINT, or until one of them ends (its
    error is raised). Stopping steps down first: the election stops renewing, the Leases are
    released once the writes in flight have ended (aggregator/lead/scope.py), and only then are the
    targets stopped, so no write of ours is cut off half-sent while another replica takes over."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait(), name="stop")
    electing = election.tasks()
    try:
        done, _ = await asyncio.wait({*tasks, *electing, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for elect in electing:
            elect.cancel()
        await asyncio.gather(*electing, return_exceptions=True)
        await asyncio.shield(election.release())
        stopper.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, stopper, return_exceptions=True)
    for task in (*tasks, *electing):
        if task in done:
            task.result()  # re-raises whatever ended it


def status_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dwd-lease-aggregator status")
    parser.add_argument(
        "--url", required=True, help="the aggregator's metrics address, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    args = parser.parse_args(argv)
    try:
        with urllib.request.urlopen(args.url.rstrip("/") + "/status", timeout=10) as response:
            status = json.load(response)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        print(f"dwd-lease-aggregator status: {args.url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    try:
        if not isinstance(status, dict) or not isinstance(status.get("targets"), list):
            raise TypeError("expected a JSON object with a list of targets")
        shown = json.dumps(status, indent=2) if args.json else render_table(status)
    except (TypeError, KeyError, ValueError, AttributeError) as e:  # someone else's JSON
        print(f"dwd-lease-aggregator status: {args.url}: not an aggregator's /status ({e})", file=sys.stderr)
        return 1
    print(shown)
    if error := status.get("source_error"):
        print(f"dwd-lease-aggregator status: the targets are unavailable: {error}", file=sys.stderr)
        return 1
    return 0


USAGE = """  dwd-lease-aggregator                 run (settings from the environment)
  dwd-lease-aggregator status [...]    what a running aggregator decides (status --help)
  dwd-lease-aggregator --help | --version"""


def main() -> None:
    if sys.argv[1:2] == ["status"]:
        sys.exit(status_main(sys.argv[2:]))
    cli.answer(
        "dwd-lease-aggregator",
        sys.argv[1:],
        about="scales a shoot's controllers down while a quorum of its nodes cannot reach its API "
        "server, and back (docs/decision.md)",
        usage=USAGE,
        read=Settings.read,
    )
    try:
        settings = Settings.from_env(os.environ)
        dependents = DEFAULT_DEPENDENTS
        if settings.scaling.dependents_file:
            dependents = load_dependents(settings.scaling.dependents_file)
    except ConfigError as e:
        print(f"dwd-lease-aggregator: {e}", file=sys.stderr)
        sys.exit(2)
    logs.configure(settings.serving.log_format, settings.serving.log_level)
    for note in settings.deprecated:
        logs.get("aggregator").warning("setting_deprecated", problem=note)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run(settings, dependents))
    except ConfigError as e:
        print(f"dwd-lease-aggregator: {e}", file=sys.stderr)
        sys.exit(2)
    except KubeError as e:
        print(f"dwd-lease-aggregator: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
