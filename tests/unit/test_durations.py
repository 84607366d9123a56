from __future__ import annotations

import pytest

from core.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("500ms", 0.5),
        ("2s", 2.0),
        ("1.5s", 1.5),
        ("1m30s", 90.0),
        ("2h45m", 9900.0),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("100ns", 1e-7),
        ("-1s", -1.0),
        (".5s", 0.5),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "s", "1x", "1s2", "1.2.3s", "ms", "2 s", "1sm"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.5, "500ms"),
        (2, "2s"),
        (1.25, "1.25s"),
        (90, "1m30s"),
        (3600, "1h0m0s"),
        (61.5, "1m1.5s"),
    ],
)
def test_format_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)
