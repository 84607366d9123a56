"""Go-style durations (``500ms``, ``2s``, ``1m30s``), the format every DWD setting uses."""

from __future__ import annotations

import math
import re

_UNITS_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string; raises ValueError naming the bad text.

    Like Go's time.ParseDuration: a sequence of decimal numbers each with a unit,
    an optional sign, and "0" alone without a unit.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    pos = 0
    total = 0.0
    while pos < len(s):
        match = _PART.match(s, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r} (want e.g. 500ms, 2s, 1m30s)")
        total += float(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    if pos == 0:
        raise ValueError(f"invalid duration {text!r} (want e.g. 500ms, 2s, 1m30s)")
    if not math.isfinite(total):
        raise ValueError(f"duration {text!r} out of range")
    return sign * total


def format_duration(seconds: float) -> str:
    """The shortest Go-style string for a duration at millisecond precision."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{ms}ms"
    whole_s, rest_ms = divmod(ms, 1000)
    if whole_s < 60:
        return f"{sign}{whole_s}.{rest_ms:03d}".rstrip("0").rstrip(".") + "s"
    minutes, secs = divmod(whole_s, 60)
    hours, minutes = divmod(minutes, 60)
    out = sign
    if hours:
        out += f"{hours}h"
    if minutes or hours:
        out += f"{minutes}m"
    frac = f".{rest_ms:03d}".rstrip("0").rstrip(".") if rest_ms else ""
    return out + f"{secs}{frac}s"
