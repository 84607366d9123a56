"""Agent footprint: RSS and CPU per renewal against a real kube-apiserver."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.table import print_table
from testenv.agents import agents_for
from testenv.controlplane import ControlPlane
from testenv.wait import wait_for


def proc_rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime in clock ticks (100 Hz)


def run(renewals: int = 1000, steady_s: float = 30.0) -> None:
    with (
        ControlPlane().running() as cp,
        tempfile.TemporaryDirectory() as tmp,
        agents_for(cp, Path(tmp)) as agents,
    ):
        agents.create_lease("bench-1")
        env = agents.env("bench-1")
        out = subprocess.run(
            [sys.executable, "-m", "bench.agent_worker", str(renewals)],
            env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            capture_output=True,
            text=True,
            check=True,
        )
        tight = json.loads(out.stdout.strip().splitlines()[-1])

        agents.create_lease("bench-2")
        proc = agents.start(agents.env("bench-2", DWD_RENEW_INTERVAL="500ms"))
        wait_for(lambda: (agents.lease("bench-2") or {}).get("spec", {}).get("renewTime"), 10, "renewal")
        time.sleep(2)
        cpu0, t0 = proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(steady_s)
        cpu1, t1 = proc_cpu_s(proc.pid), time.monotonic()
        rss = proc_rss_mib(proc.pid)
        anon, shared = proc_rss_mib(proc.pid, "RssAnon"), proc_rss_mib(proc.pid, "RssFile")
        n_steady = (t1 - t0) / 0.5
        proc.terminate()

    print_table(
        "Agent footprint (real kube-apiserver on loopback, HTTP/2, TLS)",
        ["measure", "value"],
        [
            [f"renewals back to back (bench.agent_worker {renewals})", f"{tight['renewals']:.0f}"],
            ["RSS after warm-up, MiB", f"{tight['rss_start_mib']:.1f}"],
            [f"RSS after {renewals} renewals, MiB", f"{tight['rss_end_mib']:.1f}"],
            ["CPU per renewal, ms (user+sys)", f"{tight['cpu_ms_per_renewal']:.3f}"],
            ["latency per renewal, ms", f"{tight['latency_ms']:.2f}"],
            ["connections opened", f"{tight['connections']:.0f}"],
            [f"real agent at 500ms for {steady_s:.0f}s: RSS, MiB", f"{rss:.1f}"],
            ["  of which anonymous / file-backed (shared libraries), MiB", f"{anon:.1f} / {shared:.1f}"],
            ["real agent: CPU per renewal incl. idle loop, ms", f"{(cpu1 - cpu0) * 1000 / n_steady:.2f}"],
        ],
    )


if __name__ == "__main__":
    run()
