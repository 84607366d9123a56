"""``dwd-lease-aggregator``: protect a shoot's nodes from a meltdown when the path to KAPI breaks."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import uvloop

from aggregator.dependents import DEFAULT_DEPENDENTS, load_dependents
from aggregator.kube import KubeClient, KubeconfigSource, in_cluster
from aggregator.settings import Settings
from aggregator.target import Target
from core import logs
from core.config import ConfigError
from core.errors import KubeError


async def run(settings: Settings) -> None:
    dependents = load_dependents(settings.dependents_file) if settings.dependents_file else DEFAULT_DEPENDENTS
    seed_source = KubeconfigSource(settings.seed_kubeconfig) if settings.seed_kubeconfig else in_cluster
    shoot = KubeClient(KubeconfigSource(settings.shoot_kubeconfig))
    seed = KubeClient(seed_source)
    # Fail fast on credentials we cannot even load; an unreachable server is retried instead.
    shoot.endpoint()
    seed.endpoint()
    target = Target(
        settings.namespace, settings.namespace, shoot, seed, settings=settings, dependents=dependents
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(target.run(), name="target")
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, stopper):
            t.cancel()
        await asyncio.gather(task, stopper, return_exceptions=True)
        await shoot.close()
        await seed.close()
    if task.done() and not task.cancelled():
        task.result()  # re-raises what ended the target


def main() -> None:
    try:
        settings = Settings.from_env(os.environ)
        if settings.dependents_file:
            load_dependents(settings.dependents_file)
    except ConfigError as e:
        print(f"dwd-lease-aggregator: {e}", file=sys.stderr)
        sys.exit(2)
    logs.configure(settings.log_format, settings.log_level)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run(settings))
    except KubeError as e:
        print(f"dwd-lease-aggregator: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
