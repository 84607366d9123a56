"""The real agent against servers that mean harm, its peak RSS measured: a server that answers
nothing (the baseline: every renewal times out), one that streams HTTP/1.1 header lines without
end, one that floods HTTP/2 PINGs and reads none of the answers. Each server runs in a process
of its own (testenv/net/hostile_server.py); the agent as its image runs it (testenv/base/imagelike.py), with
its server and CA set (DWD_APISERVER_URL, DWD_CA_FILE).

    python -m bench agent_hostile        (about 1 min)

Before agent/wire.py bounded what it parses (2026-12-04): the header stream grew the agent from
21 to 399 MiB within its 4 s window and 918 MiB in 10 s; the flood grew it 2.4 MiB/s."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from bench.tools.sampling import rss_mib
from bench.tools.table import print_table
from testenv.base import imagelike
from testenv.base.pki import CertificateAuthority
from testenv.base.process import spawn
from testenv.base.wait import wait_for
from testenv.worlds.agents import ByUrl, start_agent

ROOT = str(Path(__file__).resolve().parents[1])
SERVERS = {
    "silent": "accepts TLS and the request, answers nothing",
    "headers": "HTTP/1.1: a status line, then header lines without end",
    "pings": "HTTP/2: PING frames without end, none of the answers read",
}


def _one(mode: str, tmp: Path, ca: CertificateAuthority, seconds: float) -> tuple[float, float, str]:
    pair = ca.issue("srv", "srv", ip_addresses=["127.0.0.1"], server=True)
    port_file = tmp / f"{mode}.port"
    argv = [
        sys.executable,
        "-m",
        "testenv.net.hostile_server",
        mode,
        str(pair.cert),
        str(pair.key),
        str(port_file),
    ]
    server = spawn(
        f"server-{mode}", argv, log_path=tmp / f"server-{mode}.log", env={**os.environ, "PYTHONPATH": ROOT}
    )
    try:
        port = wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 10, "the server's port")
        token = tmp / "token"
        token.write_text("not-a-real-token")
        env = {
            **imagelike.env(),
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": ROOT,
            "DWD_LOG_FORMAT": "json",
        }
        log = tmp / f"agent-{mode}.log"
        agent = start_agent(
            "bench-hostile",
            token_file=token,
            server=ByUrl(f"https://127.0.0.1:{port}", ca.cert_path),
            log_path=log,
            env=env,
            name=f"agent-{mode}",
        )
        try:
            time.sleep(seconds)
            peak, now = rss_mib(agent.pid, "VmHWM"), rss_mib(agent.pid)
        finally:
            agent.stop(5)
        failures = [line for line in log.read_text().splitlines() if "renew_fail" in line or "error" in line]
        return peak, now, (failures[-1][:160] if failures else "")
    finally:
        server.kill()


def run(seconds: float = 15.0) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="dwd-bench-hostile-") as d:
        tmp = Path(d)
        ca = CertificateAuthority(tmp)
        for mode, what in SERVERS.items():
            peak, now, said = _one(mode, tmp, ca, seconds)
            rows.append([mode, what, f"{peak:.1f}", f"{now:.1f}", said or "-"])
    print_table(
        f"The agent against hostile servers, {seconds:.0f} s each (its image's interpreter settings)",
        ["server", "what it does", "peak RSS, MiB", "RSS at the end, MiB", "the agent's last failure line"],
        rows,
    )


if __name__ == "__main__":
    run()
