from __future__ import annotations

import asyncio

import pytest

from core.metrics import Registry, serve_metrics


def test_render_counters_gauges_and_labels() -> None:
    reg = Registry()
    c = reg.counter("x_total", "Things.", ["class"])
    g = reg.gauge("y", "Level.")
    reg.gauge("z_seconds", "Computed.", fn=lambda: float("inf"))
    c.inc(**{"class": "dns"})
    c.inc(2, **{"class": 'a"b'})
    g.set(1.5)
    text = reg.render()
    assert '# TYPE x_total counter\nx_total{class="a\\"b"} 2\nx_total{class="dns"} 1' in text
    assert "y 1.5" in text
    assert "z_seconds +Inf" in text
    with pytest.raises(ValueError, match="labels"):
        c.inc(other="x")
    with pytest.raises(ValueError, match="only go up"):
        c.inc(-1, **{"class": "dns"})
    with pytest.raises(ValueError, match="twice"):
        reg.counter("x_total", "again")


def test_remove_matching() -> None:
    reg = Registry()
    g = reg.gauge("g", "G.", ["target", "node"])
    g.set(1, target="a", node="1")
    g.set(1, target="a", node="2")
    g.set(1, target="b", node="1")
    g.remove_matching(target="a")
    assert [k for k, _ in g.samples()] == [("b", "1")]


def test_gauge_function_is_read_at_scrape_time() -> None:
    reg = Registry()
    g = reg.gauge("leader", "L.")
    state = {"v": 0.0}
    g.set_function(lambda: state["v"])
    assert "leader 0" in reg.render()
    state["v"] = 1.0
    assert "leader 1" in reg.render()


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    r = Registry()
    h = r.histogram("dwd_x_seconds", "X.", ["phase"], [0.1, 1.0])
    h.observe(0.05, phase="dns")
    h.observe(0.5, phase="dns")
    h.observe(3.0, phase="dns")
    text = r.render()
    assert 'dwd_x_seconds_bucket{phase="dns",le="0.1"} 1' in text
    assert 'dwd_x_seconds_bucket{phase="dns",le="1"} 2' in text
    assert 'dwd_x_seconds_bucket{phase="dns",le="+Inf"} 3' in text
    assert 'dwd_x_seconds_sum{phase="dns"} 3.55' in text
    assert 'dwd_x_seconds_count{phase="dns"} 3' in text
    assert "# TYPE dwd_x_seconds histogram" in text
    assert h.count(phase="dns") == 3


async def test_the_metrics_endpoint_serves_a_bounded_number_of_connections() -> None:
    """Connections that send nothing hold a slot for at most 5 s; beyond the cap a new one is
    closed at once, and a scrape gets through again as soon as a slot is free. Before, every
    connection was served: a client opening hundreds held the agent's memory and loop."""
    registry = Registry()
    registry.counter("dwd_test_total", "a counter").inc()
    server = await serve_metrics(registry, "127.0.0.1", 0, max_connections=3)
    port = server.sockets[0].getsockname()[1]
    try:
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 2) == b""  # closed without an answer
        writer.close()
        idle[0][1].close()
        await idle[0][1].wait_closed()
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 2)
        assert answer.startswith(b"HTTP/1.0 200 OK") and b"dwd_test_total 1" in answer
        writer.close()
        for _, w in idle[1:]:
            w.close()
            await w.wait_closed()
        await asyncio.sleep(0.1)  # the server's side of each sees its end
    finally:
        server.close()
        await server.wait_closed()
