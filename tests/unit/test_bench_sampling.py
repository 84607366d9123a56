"""bench/tools/sampling.py on this test process itself (and a zombie child)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.tools.sampling import CLK_TCK, Window, cpu_s, cpu_ticks, rss_mib


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_ticks_are_the_kernels_utime_and_stime() -> None:
    before = os.times()
    ticks = cpu_ticks(os.getpid())
    after = os.times()
    assert round((before.user + before.system) * CLK_TCK) <= ticks
    assert ticks <= round((after.user + after.system) * CLK_TCK)
    assert cpu_s(os.getpid()) >= ticks / CLK_TCK


def test_cpu_ticks_grow_with_cpu_spent() -> None:
    t0 = cpu_ticks(os.getpid())
    _burn(0.2)
    assert cpu_ticks(os.getpid()) - t0 >= 0.15 * CLK_TCK


def test_rss_grows_with_memory_touched() -> None:
    before = rss_mib(os.getpid())
    block = bytearray(64 * 2**20)  # zeroed: every page written
    try:
        assert rss_mib(os.getpid()) - before >= 60
    finally:
        del block


def test_rss_fields_add_up() -> None:
    pid = os.getpid()
    anon, file, shmem = (rss_mib(pid, f) for f in ("RssAnon", "RssFile", "RssShmem"))
    assert anon > 0
    # VmRSS is their sum, in kB: read apart, the process may have grown a little in between.
    assert abs(rss_mib(pid) - (anon + file + shmem)) < 4
    assert rss_mib(pid, "NoSuchField") == 0.0


def test_a_zombie_has_no_rss() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # exited, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert rss_mib(child.pid) == 0.0
    finally:
        child.wait()


def test_window_reports_cpu_and_rss_per_process() -> None:
    t0 = time.monotonic()
    w = Window({"me": os.getpid()}).start()
    _burn(0.2)
    time.sleep(0.2)
    out = w.stop()
    span_s = time.monotonic() - t0
    assert list(out) == ["me"]
    assert set(out["me"]) == {"cpu_pct", "rss_mib"}
    # 0.2 s of CPU (less two ticks' granularity) over the span, and at most half a core
    # (and a little) over at least 0.4 s.
    assert (0.2 - 2 / CLK_TCK) / span_s * 100 - 0.1 <= out["me"]["cpu_pct"] <= 60
    assert out["me"]["rss_mib"] == round(out["me"]["rss_mib"], 1) > 0
