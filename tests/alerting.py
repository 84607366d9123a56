"""The alerting rules (manifests/monitoring/prometheusrule.yaml) under promtool: on series a test
writes (tests/unit/test_alerts.py) and on what the real processes export, scraped from their
/metrics (tests/integration/test_alerts_scraped.py). promtool comes from Debian's ``prometheus``
package (scripts/deps.sh)."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

RULES = Path(__file__).resolve().parents[1] / "manifests" / "monitoring" / "prometheusrule.yaml"
PROMTOOL = shutil.which("promtool")

# Skipped only outside CI: .ci/run installs promtool (scripts/deps.sh), and there its absence fails.
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool is missing: apt-get install prometheus (scripts/deps.sh does)",
)


def rules() -> dict[str, Any]:
    rule: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return rule


def alert_names() -> list[str]:
    return [r["alert"] for g in rules()["spec"]["groups"] for r in g["rules"] if "alert" in r]


def rendered_annotations(alert: str, **values: str) -> dict[str, str]:
    """The alert's annotations as Prometheus renders them for ``values`` (the labels and
    ``value``, as its templates read them)."""
    rule = next(r for g in rules()["spec"]["groups"] for r in g["rules"] if r.get("alert") == alert)
    out: dict[str, str] = {}
    for key, template in rule["annotations"].items():
        text = template.replace("{{ $value }}", values.get("value", ""))
        text = text.replace("{{ $value | humanizeDuration }}", values.get("duration", ""))
        for name, value in values.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", value)
        out[key] = text
    return out


def promtool(
    tmp_path: Path, *tests: dict[str, Any], groups: list[dict[str, Any]] | None = None
) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on ``tests`` over the seed's rules (or ``groups``)."""
    assert PROMTOOL is not None
    groups = rules()["spec"]["groups"] if groups is None else groups
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": list(tests)})
    )
    return subprocess.run(
        [PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def alert(at: str, name: str, *expected: dict[str, str]) -> dict[str, Any]:
    """``expected``: each firing alert's labels and the values its annotations render."""
    exp = []
    for e in expected:
        labels = {k: v for k, v in e.items() if k not in ("value", "duration")}
        exp.append({"exp_labels": labels, "exp_annotations": rendered_annotations(name, **e)})
    return {"eval_time": at, "alertname": name, "exp_alerts": exp}


# -- what a process exports, as promtool's input


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)$")


def scrape(port: int) -> str:
    """A process's /metrics on this host, as Prometheus scrapes it."""
    return httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False, timeout=5).text


def samples(exposition: str) -> dict[str, float]:
    """A /metrics answer (Prometheus text format) by series, as ``name{labels}``."""
    out: dict[str, float] = {}
    for line in exposition.splitlines():
        if m := _SAMPLE.match(line):
            out[m[1] + (m[2] or "")] = float(m[3])
    return out


def _labelled(key: str, labels: dict[str, str]) -> str:
    extra = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    if not extra:
        return key
    return f"{key[:-1]},{extra}}}" if key.endswith("}") else f"{key}{{{extra}}}"


def scraped(
    first: str, then: str | None = None, *, apart_s: float = 60.0, minutes: int = 20, **labels: str
) -> list[dict[str, str]]:
    """Every series of a scrape as promtool's input for ``minutes``, with the labels a
    Prometheus scrape adds (``instance``, ``pod``). With a second scrape ``apart_s`` later, each
    goes on as it went between the two (an age that grows, a counter that counts); alone, each
    stays where it was."""
    a = samples(first)
    b = samples(then) if then is not None else a
    out = []
    for key, start in sorted(a.items()):
        end = b.get(key, start)
        if not (math.isfinite(start) and math.isfinite(end)):
            # +Inf is a value too (an agent's age before its first renewal): held as it ended.
            values = " ".join([_token(end)] * (minutes + 1))
        elif step := (end - start) * 60.0 / apart_s:
            values = f"{start!r}{'+' if step > 0 else ''}{step!r}x{minutes}"
        else:
            values = f"{start!r}x{minutes}"
        out.append({"series": _labelled(key, labels), "values": values})
    return out


def _token(v: float) -> str:
    return "NaN" if math.isnan(v) else "+Inf" if v == math.inf else "-Inf" if v == -math.inf else f"{v:g}"


def humanize_duration(v: float) -> str:
    """Prometheus's ``humanizeDuration`` (its template functions), for an annotation's value."""
    if not math.isfinite(v):
        return _token(v)
    if abs(v) < 1:
        raise ValueError(f"{v}: below a second Prometheus uses SI prefixes, not needed here")
    sign, v = ("-", -v) if v < 0 else ("", v)
    s = int(v)
    days, hours, minutes, seconds = s // 86400, s // 3600 % 24, s // 60 % 60, s % 60
    if days:
        return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
    if hours:
        return f"{sign}{hours}h {minutes}m {seconds}s"
    if minutes:
        return f"{sign}{minutes}m {seconds}s"
    return f"{sign}{v:.4g}s"


def check(tmp_path: Path, input_series: list[dict[str, str]], *alert_tests: dict[str, Any]) -> None:
    """promtool's verdict on ``alert_tests`` (each from ``alert``) over these series."""
    out = promtool(
        tmp_path, {"interval": "1m", "input_series": input_series, "alert_rule_test": list(alert_tests)}
    )
    assert out.returncode == 0, out.stdout + out.stderr
