"""HTTP for operators: /metrics, /healthz, /readyz, /status (JSON) and / (a small HTML page)."""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from aggregator.model.settings import DeciderSettings
from core.metrics import CONTENT_TYPE, Registry

# What a status without its settings (an older replica's, a test's) is read with: the defaults.
DEFAULTS = DeciderSettings()

StatusFn = Callable[[], dict[str, Any]]


def make_app(registry: Registry, status: StatusFn, unready: Callable[[], str]) -> web.Application:
    """``unready``: why the aggregator is not ready ("" when it is)."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=registry.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        why = unready()
        return web.Response(status=503, text=f"not ready: {why}\n") if why else web.Response(text="ok\n")

    async def status_json(_: web.Request) -> web.Response:
        return web.json_response(status())

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=render_page(status()), content_type="text/html")

    app = web.Application()
    app.add_routes(
        [
            web.get("/metrics", metrics),
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/status", status_json),
            web.get("/", page),
        ]
    )
    return app


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


PHASE_COLOURS = {
    "healthy": "#1a7f37",
    "confirming": "#bf8700",
    "scaled-down": "#cf222e",
    "recovering": "#0969da",
    "starting": "#57606a",
    "unavailable": "#57606a",
}


def _ago(ts: float | None) -> str:
    if not ts:
        return ""
    s = int(time.time() - ts)
    return f"{s}s" if s < 120 else f"{s // 60}m{s % 60:02d}s"


def _sparkline(history: list[list[float]] | list[tuple[float, float]], threshold: float) -> str:
    """The stale fraction over the last minutes as an inline SVG (0 at the bottom, 1 at the top)."""
    w, h = 240, 40
    if len(history) < 2:
        return f'<svg width="{w}" height="{h}"></svg>'
    t0, t1 = history[0][0], history[-1][0]
    span = max(t1 - t0, 1.0)
    pts = " ".join(f"{(t - t0) / span * w:.1f},{h - f * h:.1f}" for t, f in history)
    y = h - threshold * h
    return (
        f'<svg width="{w}" height="{h}" class="spark"><line x1="0" x2="{w}" y1="{y:.1f}" y2="{y:.1f}" '
        f'stroke="#cf222e" stroke-dasharray="3,3"/>'
        f'<polyline fill="none" stroke="#0969da" points="{pts}"/></svg>'
    )


def _why(t: dict[str, Any]) -> str:
    return str(t.get("blocked") or t.get("error") or t.get("reason") or "")


def _dependents(t: dict[str, Any]) -> str:
    """What the actuator wants and what it last read: "running: kube-controller-manager 3/3, ..."."""
    parts = []
    for name, d in (t.get("dependents") or {}).items():
        if not d.get("exists", True):
            parts.append(f"{name} absent")
            continue
        record = d.get("record")
        mark = f" (ours: {record.get('replicas')} taken away)" if isinstance(record, dict) else ""
        if d.get("foreign"):
            mark = f" (somebody else's record: replicas {d.get('dwd_replicas')}, left alone)"
        if d.get("newer_format"):
            mark += f" (a later release's record, format {d['newer_format']}: read as far as known)"
        if d.get("ignored"):
            mark += " (ignore-scaling)"
        error = f" error: {d['error']}" if d.get("error") else ""
        parts.append(f"{name} {d.get('ready', 0)}/{d.get('replicas', 0)}{mark}{error}")
    desired = t.get("desired") or "-"
    return f"{desired}: {', '.join(parts)}" if parts else str(desired)


def shown_phase(t: Mapping[str, Any]) -> str:
    """The phase as shown: a healthy target that judges nothing (no view of the shoot, too few
    candidates) is not shown as plainly healthy."""
    phase = str(t.get("phase", ""))
    return f"{phase} (not judging)" if phase == "healthy" and t.get("judging") is False else phase


def _row(t: dict[str, Any], threshold: float) -> str:
    e = html.escape
    phase = str(t.get("phase", ""))
    colour = PHASE_COLOURS.get(phase, "#57606a") if shown_phase(t) == phase else "#57606a"
    phase = shown_phase(t)
    return (
        "<tr>"
        f'<td class="name">{e(t.get("name", ""))}</td>'
        f'<td><span class="phase" style="background:{colour}">{e(phase)}</span></td>'
        f"<td>{_ago(t.get('since'))}</td>"
        f"<td>{t.get('stale', 0)}/{t.get('candidates', 0)}</td>"
        f"<td>{float(t.get('fraction', 0)):.0%}</td>"
        f"<td>{_sparkline(t.get('history', []), threshold)}</td>"
        f"<td>{e(_why(t))}</td>"
        f"<td>{e(_dependents(t))}</td>"
        "</tr>"
    )


def _lease_ages(t: dict[str, Any], lease_duration: float) -> str:
    e = html.escape
    ages = t.get("lease_ages") or {}
    cells = "".join(
        f'<span class="lease {"stale" if age >= lease_duration else "fresh"}" title="{e(n)}">'
        f"{e(n)} {age:.1f}s</span>"
        for n, age in sorted(ages.items(), key=lambda kv: -kv[1])
    )
    return f"<h3>{e(t.get('name', ''))}: lease ages</h3><div class='leases'>{cells or 'none'}</div>"


def render_page(status: dict[str, Any]) -> str:
    e = html.escape
    threshold = float(status.get("failure_fraction", DEFAULTS.failure_fraction))
    lease_duration = float(status.get("lease_duration_s", DEFAULTS.lease_duration_s))
    targets = status.get("targets", [])
    rows = [_row(t, threshold) for t in targets]
    details = [_lease_ages(t, lease_duration) for t in targets]
    leader = "leader" if status.get("leader") else "standby"
    dry = " · DRY RUN: nothing is scaled" if status.get("dry_run") else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>dwd-lease aggregator</title>
<style>
body{{font:14px system-ui,sans-serif;margin:1.5em;color:#1f2328}}
table{{border-collapse:collapse}}td,th{{padding:.35em .7em;border-bottom:1px solid #d0d7de;text-align:left}}
.phase{{color:#fff;border-radius:1em;padding:.1em .7em}}.name{{font-weight:600}}
.lease{{display:inline-block;margin:.15em;padding:.1em .4em;border-radius:.3em;font:12px monospace}}
.fresh{{background:#dafbe1}}.stale{{background:#ffebe9}}
</style></head><body>
<h1>dwd-lease aggregator</h1>
<p>{e(str(status.get("identity", "")))} · {leader}{e(dry)} · failure fraction {threshold:.0%} ·
lease duration {lease_duration:g}s · {len(status.get("targets", []))} target(s)</p>
<table><tr><th>target</th><th>state</th><th>since</th><th>stale</th><th>fraction</th>
<th>stale fraction, last minutes</th><th>why</th><th>controllers: desired, observed</th></tr>
{"".join(rows)}
</table>
{"".join(details)}
</body></html>
"""


def render_table(status: dict[str, Any]) -> str:
    """The status as a plain table, for ``dwd-lease-aggregator status``."""
    header = ("TARGET", "STATE", "SINCE", "STALE", "FRACTION", "WHY")
    rows = [header]
    for t in status.get("targets", []):
        rows.append(
            (
                str(t.get("name", "")),
                shown_phase(t),
                _ago(t.get("since")),
                f"{t.get('stale', 0)}/{t.get('candidates', 0)}",
                f"{float(t.get('fraction', 0)):.0%}",
                _why(t)[:80],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    role = "leader" if status.get("leader") else "standby"
    dry = ", dry-run" if status.get("dry_run") else ""
    return f"{status.get('identity', '')} ({role}{dry})\n" + "\n".join(lines)
