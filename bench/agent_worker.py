"""Runs N renewals back to back in this process and reports its RSS and CPU per renewal.

The same code path as the agent (LeaseClient + Renewer.renew_once), minus the
sleeps between renewals, so 1000 renewals take seconds instead of half an hour.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time

from agent.client import LeaseClient
from agent.renewer import Renewer
from agent.settings import Settings
from bench.tools.sampling import rss_mib
from core import logs


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main(n: int) -> dict[str, float]:
    settings = Settings.from_env(os.environ)
    logs.configure(settings.log_format, settings.log_level)
    client = LeaseClient.for_settings(settings)
    renewer = Renewer(settings, client)
    await renewer.renew_once()  # warm: connection, imports, first TLS handshake
    rss_start, cpu0, wall0 = rss_mib(os.getpid()), cpu_s(), time.perf_counter()
    for _ in range(n):
        await renewer.renew_once()
    cpu1, wall1 = cpu_s(), time.perf_counter()
    await client.aclose()
    return {
        "renewals": renewer.metrics.renewals.get(),
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_mib(os.getpid()),
        "cpu_ms_per_renewal": (cpu1 - cpu0) * 1000 / n,
        "latency_ms": (wall1 - wall0) * 1000 / n,
        "connections": client.connections_opened,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1])))))
