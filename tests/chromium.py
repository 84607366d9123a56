"""Debian's chromium, headless, for the tests that look at a page as a browser lays it out (the
status page, the demo's picture). Only loopback and files: no network of its own."""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium(profile: Path) -> list[str]:
    """The command line up to the URL, with a profile of its own under ``profile``."""
    path = shutil.which("chromium")
    assert path, "Debian's chromium is needed for this test: `make deps` (or apt-get install chromium)"
    return [path, *FLAGS, f"--user-data-dir={profile}"]


def dump_dom(url: str, profile: Path) -> str:
    """The page's DOM once loaded and its scripts have run."""
    argv = [*chromium(profile), "--dump-dom", url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


def screenshot(url: str, png: Path, profile: Path, size: tuple[int, int]) -> None:
    argv = [
        *chromium(profile),
        f"--screenshot={png}",
        f"--window-size={size[0]},{size[1]}",
        "--hide-scrollbars",
        url,
    ]
    subprocess.run(argv, capture_output=True, timeout=60, check=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png}: not a PNG"


# Laid out by the browser: every world of the picture (its box, each series' and each mark's box)
# and the texts drawn outside the canvas or not at all.
_MEASURE = """<script>
const svg = document.querySelector('svg'), c = svg.getBoundingClientRect();
const box = (e) => e.getBoundingClientRect().toJSON();
const out = {canvas: c.toJSON(), worlds: {}, unseen: []};
for (const g of svg.querySelectorAll('g.world')) {
  const w = {box: box(g), series: {}, marks: {}};
  for (const p of g.querySelectorAll('path.series')) w.series[p.dataset.series] = box(p);
  for (const l of g.querySelectorAll('line.mark')) w.marks[l.dataset.mark] = box(l);
  out.worlds[g.dataset.world] = w;
}
for (const t of svg.querySelectorAll('text')) {
  const r = t.getBoundingClientRect();
  if (!r.width || r.left < c.left || r.right > c.right || r.top < c.top || r.bottom > c.bottom)
    out.unseen.push(t.textContent);
}
document.getElementById('measured').textContent = JSON.stringify(out);
</script>"""


def laid_out(svg: Path, work: Path) -> dict[str, Any]:
    """What chromium makes of the SVG picture ``svg``: the SVG inline in a page whose script
    measures it, the page's DOM read back (``work``: the page and the profile)."""
    page = work / f"{svg.stem}-measured.html"
    body = f"<pre id='measured'></pre>{_MEASURE}"
    page.write_text(f"<!doctype html><html><body style='margin:0'>{svg.read_text()}{body}</body></html>")
    dom = dump_dom(page.resolve().as_uri(), work / "profile")
    start = dom.index('<pre id="measured">') + len('<pre id="measured">')
    measured: dict[str, Any] = json.loads(html.unescape(dom[start : dom.index("</pre>", start)]))
    return measured
