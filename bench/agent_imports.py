"""What each import of the agent costs: RSS (anonymous and file-backed apart), the Python heap
tracemalloc sees, the time it takes, and how many modules it loads, stage by stage in the
order ``python -m agent`` imports them. Each stage runs in a fresh interpreter that imports
every stage up to it, so a row is what that stage adds on top of the ones above.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.tools.table import print_table
from testenv.base import imagelike

ROOT = Path(__file__).resolve().parents[1]

# (label, modules): cumulative, in the agent's own order (agent/__main__.py and what it imports).
STAGES: list[tuple[str, list[str]]] = [
    ("bare interpreter", []),
    ("ssl (OpenSSL)", ["ssl"]),
    ("asyncio", ["asyncio"]),
    ("h2 (HTTP/2: hpack, hyperframe)", ["h2.connection"]),
    ("structlog", ["structlog"]),
    ("yaml", ["yaml"]),
    ("the agent's own modules", ["agent.__main__"]),
]

_PROBE = """
import importlib, json, sys, time
trace = sys.argv[1] == "1"
if trace:
    import tracemalloc
    tracemalloc.start()
def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out
stages = json.loads(sys.argv[2])
for mods in stages[:-1]:
    for m in mods:
        importlib.import_module(m)
before = set(sys.modules)
heap0 = tracemalloc.get_traced_memory()[0] if trace else 0
t0 = time.perf_counter()
for m in stages[-1]:
    importlib.import_module(m)
took = time.perf_counter() - t0
heap = (tracemalloc.get_traced_memory()[0] - heap0) if trace else 0
print(json.dumps({**status(), "ms": took * 1000, "heap_mib": heap / 2**20,
                  "modules": len(set(sys.modules) - before)}))
"""


def _probe(stages: list[list[str]], trace: bool, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, "1" if trace else "0", json.dumps(stages)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def measure(repeat: int = 3) -> list[dict[str, float | str]]:
    """One row per stage: RSS after it (median of ``repeat`` fresh interpreters), what it adds,
    its Python heap and import time; with the settings of the agent's image."""
    env = {**os.environ, **imagelike.env()}
    rows: list[dict[str, float | str]] = []
    for i, (label, _) in enumerate(STAGES):
        stages = [mods for _, mods in STAGES[: i + 1]]
        runs = sorted((_probe(stages, False, env) for _ in range(repeat)), key=lambda r: r["VmRSS"])
        plain = runs[len(runs) // 2]
        traced = _probe(stages, True, env)
        rows.append(
            {
                "stage": label,
                "rss": plain["VmRSS"],
                "anon": plain["RssAnon"],
                "file": plain["RssFile"],
                "heap": traced["heap_mib"],
                "ms": plain["ms"],
                "modules": plain["modules"],
            }
        )
    return rows


def run() -> None:
    rows = measure()
    table = []
    previous = 0.0
    for r in rows:
        rss = float(r["rss"])
        table.append(
            [
                r["stage"],
                f"{rss:.1f}",
                f"+{rss - previous:.1f}" if previous else "",
                f"{float(r['anon']):.1f} / {float(r['file']):.1f}",
                f"{float(r['heap']):.2f}",
                f"{float(r['ms']):.0f}",
                f"{int(r['modules'])}",
            ]
        )
        previous = rss
    print_table(
        "Agent imports, stage by stage (fresh interpreter each, as the image runs it: "
        "PYTHONOPTIMIZE=2; RSS the median of 3)",
        ["stage", "RSS MiB", "adds", "anon / file MiB", "Python heap MiB", "import ms", "modules"],
        table,
    )


if __name__ == "__main__":
    run()
