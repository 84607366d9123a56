from __future__ import annotations

import pytest

from core.metrics import Registry


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
