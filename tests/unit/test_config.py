from __future__ import annotations

import pytest

from core.config import ConfigError, EnvReader


def test_every_problem_is_reported_at_once() -> None:
    r = EnvReader({"A": "soon", "B": "1.5", "C": "x", "D": "maybe", "E": "loud"})
    r.duration("A", "2s")
    r.fraction("B", 0.6)
    r.integer("C", 2)
    r.boolean("D", False)
    r.choice("E", "info", ("debug", "info"))
    r.string("F", required=True)
    with pytest.raises(ConfigError) as e:
        r.finish()
    text = str(e.value)
    for name in "ABCDEF":
        assert f"  - {name}: " in text
    assert len(e.value.problems) == 6


def test_defaults_and_empty_values() -> None:
    r = EnvReader({"A": "", "B": "  "})
    assert r.duration("A", "2s") == 2.0
    assert r.fraction("B", 0.6) == 0.6
    assert r.address("M") is None
    r.finish()


def test_ranges_and_addresses() -> None:
    r = EnvReader({"A": "10m", "P": ":9100", "Q": "127.0.0.1:99999", "R": "[::1]:80"})
    r.duration("A", "2s", max_s=60)
    assert r.address("P") == ("0.0.0.0", 9100)
    assert r.address("Q") is None
    assert r.address("R") == ("::1", 80)
    with pytest.raises(
        ConfigError, match=r"(?s)A: 10m is out of range .*Q: '127.0.0.1:99999' is not host:port"
    ):
        r.finish()
