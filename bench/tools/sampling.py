"""Processes sampled through /proc: CPU (utime + stime, in clock ticks) and RSS."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` (fields 14 and 15 of /proc/<pid>/stat), in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    return cpu_ticks(pid) / CLK_TCK


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """VmRSS (or another ``field`` of /proc/<pid>/status in kB: RssAnon, RssFile, VmHWM) of
    ``pid`` in MiB; 0 for a process without it (a zombie)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Window:
    """CPU of some processes over a stretch of time, and their RSS at its end."""

    pids: dict[str, int]
    t0: float = 0.0
    ticks0: dict[str, int] | None = None

    def start(self) -> Window:
        self.t0 = time.monotonic()
        self.ticks0 = {k: cpu_ticks(p) for k, p in self.pids.items()}
        return self

    def stop(self) -> dict[str, dict[str, float]]:
        """Per process: CPU in % of one core over the window, rounded to 0.1, and RSS in MiB."""
        dt = time.monotonic() - self.t0
        t0 = self.ticks0 or {}
        return {
            k: {
                "cpu_pct": round((cpu_ticks(p) - t0[k]) / CLK_TCK / dt * 100, 1),
                "rss_mib": round(rss_mib(p), 1),
            }
            for k, p in self.pids.items()
        }
