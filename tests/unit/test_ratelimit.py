"""The Events' pace: a burst at once, then a steady rate, each caller at its own moment."""

from __future__ import annotations

import asyncio
import ssl
import time

import pytest
from aiohttp import web

from aggregator.__main__ import EVENTS_BURST, EVENTS_QPS, SeedClients
from aggregator.kube.endpoint import Endpoint
from aggregator.kube.ratelimit import RateLimit
from core.errors import Throttled
from tests.unit.virtualtime import in_virtual_time, now
from tests.unit.world import Clock


def test_a_burst_goes_at_once_then_one_per_interval_in_the_order_asked() -> None:
    clock = Clock(0.0)
    rate = RateLimit(qps=10, burst=3, clock=clock)
    assert [round(rate.reserve(), 6) for _ in range(6)] == [0, 0, 0, 0.1, 0.2, 0.3]
    clock.now = 10.0  # idle for long: the whole burst is back, no more
    assert [round(rate.reserve(), 6) for _ in range(4)] == [0, 0, 0, 0.1]
    clock.now = 10.05  # half an interval later: still behind the one that waits 0.1
    assert round(rate.reserve(), 6) == 0.15


def test_a_request_that_would_wait_too_long_is_refused_and_takes_no_moment() -> None:
    clock = Clock(0.0)
    rate = RateLimit(qps=10, burst=1, max_wait_s=0.25, clock=clock)
    assert [round(rate.reserve(), 6) for _ in range(3)] == [0, 0.1, 0.2]
    with pytest.raises(Throttled, match="rate limit of 10/s"):
        rate.reserve()
    clock.now = 0.1
    assert round(rate.reserve(), 6) == 0.2  # the refused one took nothing


@in_virtual_time  # the 10 ms it waits are 10 ms, however loaded the machine
async def test_a_waiter_cancelled_gives_its_moment_back() -> None:
    """A stopping target cancels the Events it queued: the Events after them do not wait for
    moments nobody uses."""
    rate = RateLimit(qps=1, burst=1, clock=now)
    await rate.wait()
    waiters = [asyncio.create_task(rate.wait()) for _ in range(3)]
    await asyncio.sleep(0.01)
    for w in waiters[::-1]:  # the last first: each is then the latest moment handed out
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert 0.9 <= rate.reserve() <= 1.0  # right behind the first, not 3 s later


def test_nonsense_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="qps > 0"):
        RateLimit(qps=0, burst=1)
    with pytest.raises(ValueError, match="burst >= 1"):
        RateLimit(qps=1, burst=0)


async def test_the_seeds_events_client_sends_a_burst_then_its_pace() -> None:
    """In a seed-wide outage 750 Events went out with the scale writes of every target: the
    events client holds them to its own pace, a single target's few go at once."""
    arrived: list[float] = []

    async def event(_: web.Request) -> web.Response:
        arrived.append(time.monotonic())
        return web.json_response({"kind": "Event"}, status=201)

    app = web.Application()
    app.add_routes([web.post("/api/v1/namespaces/shoot/events", event)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    endpoint = Endpoint(
        f"http://127.0.0.1:{runner.addresses[0][1]}", ssl.create_default_context(), lambda: None, "t"
    )
    clients = SeedClients.of(lambda: endpoint)
    try:
        started = time.monotonic()
        sent = EVENTS_BURST + 10
        await asyncio.gather(
            *(clients.events.create("/api/v1/namespaces/shoot/events", {}) for _ in range(sent))
        )
        offsets = sorted(t - started for t in arrived)
        assert len(offsets) == sent
        assert offsets[EVENTS_BURST - 1] < 0.5  # the burst at once
        assert offsets[-1] >= 10 / EVENTS_QPS - 0.02  # the rest at the pace
    finally:
        await clients.close()
        await runner.cleanup()
