"""Agent footprint: RSS and CPU per renewal against a real kube-apiserver, with the interpreter
settings of the agent's image (testenv/base/imagelike.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.tools.sampling import cpu_s, rss_mib
from bench.tools.table import print_table
from image import build
from testenv.base import containers, imagelike
from testenv.base.wait import wait_for
from testenv.kube.controlplane import ControlPlane
from testenv.worlds.agents import Agents, agents_for


def run(renewals: int = 1000, steady_s: float = 30.0) -> None:
    image_like = imagelike.env()
    # The DaemonSet's agent starts at its default interval; the aggregator may hand it another.
    interval_s = 2.0
    with (
        ControlPlane().running() as cp,
        tempfile.TemporaryDirectory() as tmp,
        agents_for(cp, Path(tmp)) as agents,
    ):
        agents.create_lease("bench-1")
        env = agents.env("bench-1")
        out = subprocess.run(
            [sys.executable, "-m", "bench.agent_worker", str(renewals)],
            env={**env, **image_like, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            capture_output=True,
            text=True,
            check=True,
        )
        tight = json.loads(out.stdout.strip().splitlines()[-1])

        agents.create_lease("bench-2")
        proc = agents.start(
            agents.kubelet_env("bench-2", DWD_RENEW_INTERVAL=f"{interval_s:g}s", **image_like)
        )
        wait_for(lambda: (agents.lease("bench-2") or {}).get("spec", {}).get("renewTime"), 10, "renewal")
        checkout = _steady(proc.pid, interval_s, steady_s, f"real agent at its default {interval_s:g}s")
        proc.terminate()
        image = _from_image(agents, interval_s, steady_s)

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
            *checkout,
            *image,
        ],
    )


def _from_image(agents: Agents, interval_s: float, steady_s: float) -> list[list[str]]:
    """The same measure of the agent as its image runs it (Debian's interpreter, the cut
    standard library), when `make image` has built it; rows saying why not otherwise."""
    if not build.archive("agent").exists() or build.missing_tools():
        return [["agent from its image", "not measured: `make image` first"]]
    ref = build.load("agent")
    agents.create_lease("bench-3")
    env = agents.kubelet_env("bench-3", DWD_RENEW_INTERVAL=f"{interval_s:g}s")
    env.pop("PATH")
    name = "dwd-lease-bench-agent"
    files = {Path(env[k]): env[k] for k in ("DWD_TOKEN_FILE", "DWD_KUBELET_KUBECONFIG")}
    # As the DaemonSet runs it: uid 0 (to read the kubelet kubeconfig), on the host's network.
    proc = containers.run(
        ref, name=name, log_path=agents.tmp / f"{name}.log", env=env, mounts=files, network="host", user="0:0"
    )
    try:
        wait_for(lambda: (agents.lease("bench-3") or {}).get("spec", {}).get("renewTime"), 30, "renewal")
        pid = int(build.run(["podman", "inspect", "--format", "{{.State.Pid}}", name]).strip())
        return _steady(pid, interval_s, steady_s, f"agent from its image at {interval_s:g}s")
    finally:
        proc.terminate()
        containers.remove(name)


def _steady(pid: int, interval_s: float, steady_s: float, label: str) -> list[list[str]]:
    """An agent's RSS (anonymous and file-backed apart) and CPU per renewal over ``steady_s``
    after it has settled; the rows for the table."""
    time.sleep(2)
    cpu0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(steady_s)
    cpu1, t1 = cpu_s(pid), time.monotonic()
    rss, anon, shared = (rss_mib(pid, f) for f in ("VmRSS", "RssAnon", "RssFile"))
    cpu_ms = (cpu1 - cpu0) * 1000 / ((t1 - t0) / interval_s)
    return [
        [f"{label} for {steady_s:.0f}s: RSS, MiB", f"{rss:.1f}"],
        ["  of which anonymous / file-backed (shared libraries), MiB", f"{anon:.1f} / {shared:.1f}"],
        [f"{label}: CPU per renewal incl. idle loop, ms", f"{cpu_ms:.2f}"],
    ]


if __name__ == "__main__":
    run()
