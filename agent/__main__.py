"""``dwd-lease-agent``: renew this node's lease until SIGTERM, then release it and exit 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from agent.client import LeaseClient
from agent.renewer import Renewer
from agent.settings import Settings
from core import cli, logs
from core.config import ConfigError
from core.metrics import Registry, serve_metrics


async def run(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    registry = Registry()
    registry.gauge(
        "dwd_agent_settings_unknown", "DWD_ variables set that this agent does not know (ignored)"
    ).set(len(settings.unknown))
    client = LeaseClient.for_settings(settings)
    renewer = Renewer(settings, client, registry)
    client.on_attempt = renewer.observe  # each attempt's timings, to the renewer's metrics
    server = await metrics_server(registry, settings.metrics_addr)
    try:
        await renewer.run(stop)
    finally:
        if server is not None:
            server.close()


async def metrics_server(registry: Registry, addr: tuple[str, int] | None) -> asyncio.Server | None:
    """The metrics endpoint, or None: a port another process holds on this node (the agent
    shares the host's network) costs the metrics, never the renewals."""
    if addr is None:
        return None
    try:
        return await serve_metrics(registry, *addr)
    except OSError as e:
        logs.get("agent").error("metrics_unavailable", addr=f"{addr[0]}:{addr[1]}", error=str(e))
        return None


USAGE = """  dwd-lease-agent              renew this node's lease until SIGTERM
  dwd-lease-agent --help | --version"""


def main() -> None:
    cli.answer(
        "dwd-lease-agent",
        sys.argv[1:],
        about="renews this node's lease through the path KCM judges (docs/agent.md)",
        usage=USAGE,
        read=Settings.read,
    )
    try:
        settings = Settings.from_env(os.environ)
    except ConfigError as e:
        print(f"dwd-lease-agent: {e}", file=sys.stderr)
        sys.exit(2)
    logs.configure(settings.log_format, settings.log_level)
    log = logs.get("agent")
    for note in settings.deprecated:
        log.warning("setting_deprecated", problem=note)
    for problem in settings.unknown:
        # Not fatal: an agent rolled back under newer manifests must keep renewing on every node.
        log.warning("setting_unknown", problem=problem)
    # asyncio's own loop, not uvloop (which the aggregator runs on): one request every two
    # seconds gains nothing measurable from it, and it costs 1.7 MiB on every node with the
    # idna codec it loads for every name (docs/agent.md, "Measured").
    asyncio.run(run(settings))


if __name__ == "__main__":
    main()
