"""The agent as its own process, with a token bound to a Pod on its node, against the real API server."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.errors import Unauthorized
from core.lease import LAST_OUTAGE, RELEASED, RENEW_INTERVAL, Outage, node_lease_path, parse_micro_time
from testenv.base.kapi import Client
from testenv.base.process import spawn_python
from testenv.base.wait import wait_for
from testenv.kube.controlplane import free_port
from testenv.net.tcpproxy import TcpProxy
from testenv.worlds.agents import NS, Agents
from tests.alerting import alert, check, humanize_duration, samples, scrape, scraped

pytestmark = pytest.mark.integration


def renewed(agents: Agents, node: str) -> bool:
    return bool(((agents.lease(node) or {}).get("spec") or {}).get("renewTime"))


def test_renews_at_the_configured_interval(agents: Agents) -> None:
    agents.create_lease("pace-1")
    agent = agents.start(agents.env("pace-1"))
    wait_for(lambda: renewed(agents, "pace-1"), 10, "the first renewal")
    seen = agents.renew_times("pace-1", 2.9)
    # The pace by the agent's own stamps (renewTime): when this poll saw each renewal depends
    # on the API server's answer under load, not on the agent.
    stamps = [parse_micro_time(renew) for _, renew in seen]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    # 500ms interval: 5 or 6 renewals in 2.9 s, none late by half an interval.
    assert 5 <= len(seen) <= 7, seen
    assert all(0.3 < g < 0.75 for g in gaps), gaps
    lease = agents.lease("pace-1")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "pace-1"
    assert agent.alive()


# What an agent never loads, with what each cost it on every node (docs/measured.md, "The
# agent's memory, MiB by MiB"): the loop it does not run, the idna codec (a name goes to the
# resolver and to TLS as ASCII bytes), strptime, pathlib, urllib.parse (with ipaddress), and
# hashlib at the default interval.
NEVER_LOADED = (
    "uvloop",
    "encodings.idna",
    "unicodedata",
    "_strptime",
    "pathlib",
    "urllib.parse",
    "ipaddress",
    "hashlib",
    "httpx",
    "random",
)


def test_a_renewing_agent_loads_nothing_it_was_trimmed_of(agents: Agents, tmp_path: Path) -> None:
    """As the DaemonSet runs it: the server and the CA from a kubelet kubeconfig, a name (not
    an address) to resolve, renewals at the default interval, then SIGTERM."""
    agents.create_lease("trim-1")
    env = agents.kubelet_env("trim-1", DUMP=str(tmp_path / "modules.json"), DWD_RENEW_INTERVAL="2s")
    log = tmp_path / "agent.log"
    agent = spawn_python("agent-trim-1", "tests.integration.agent_modules", log_path=log, env=env)
    first = wait_for(lambda: (agents.lease("trim-1") or {}).get("spec", {}).get("renewTime"), 10, "renewals")

    def renewed_again() -> bool:
        lease = agents.lease("trim-1")
        assert lease is not None, "the lease trim-1 is gone"
        return bool(lease["spec"]["renewTime"] != first)

    # A second renewal: the kept connection's path too.
    wait_for(renewed_again, 5, f"a renewal after {first}")
    agent.stop()
    loaded = set(json.loads((tmp_path / "modules.json").read_text()))
    assert {"agent.wire", "h2.connection", "yaml", "structlog"} <= loaded  # it did run
    assert sorted(loaded & set(NEVER_LOADED)) == []


def test_waits_quietly_for_its_lease_then_renews_without_restart(agents: Agents) -> None:
    agent = agents.start(agents.env("late-1"))
    wait_for(lambda: "lease_missing" in agent.names(), 10, "the agent to notice its lease is missing")
    time.sleep(1.2)
    assert agents.lease("late-1") is None
    assert agent.names().count("lease_missing") == 1  # once, not every 500ms
    assert "renew_failing" not in agent.names()  # a missing lease is not an outage
    agents.create_lease("late-1")
    # The wait after a 404 doubles (0.5, 1, 2, 4 s at this interval): the next poll finds it.
    wait_for(lambda: renewed(agents, "late-1"), 10, "renewals once the lease exists")
    assert agent.alive()


def test_sigterm_releases_the_lease_and_restart_clears_it(agents: Agents) -> None:
    agents.create_lease("term-1")
    env = agents.env("term-1")
    agent = agents.start(env)
    wait_for(lambda: renewed(agents, "term-1"), 10, "the first renewal")
    started = time.monotonic()
    assert agent.terminate(timeout_s=2) == 0
    assert time.monotonic() - started < 2
    lease = agents.lease("term-1")
    assert lease is not None
    assert lease["metadata"]["annotations"][RELEASED] == "true"
    assert "lease_released" in agent.names()

    agents.start(env)
    wait_for(
        lambda: RELEASED not in ((agents.lease("term-1") or {})["metadata"].get("annotations") or {}),
        10,
        "the restarted agent to clear released",
    )


def test_rotated_token_is_picked_up(agents: Agents) -> None:
    agents.create_lease("rot-1")
    env = agents.env("rot-1")
    agent = agents.start(env)
    wait_for(lambda: renewed(agents, "rot-1"), 10, "the first renewal")
    # A new token bound to a new Pod replaces the file; deleting the old Pod
    # invalidates the old token, so only a re-read token can keep renewing.
    old_token = (agents.tmp / "rot-1.token").read_text()
    agents.token_file("rot-1", pod="dwd-lease-agent-rot-1-b")
    agents.admin.request(
        "DELETE", f"/api/v1/namespaces/{NS}/pods/dwd-lease-agent-rot-1", {"gracePeriodSeconds": 0}
    )
    with agents.cp.token_client(old_token) as old:
        wait_for(lambda: _rejected(old), 10, "the old token to be rejected")
    seen = agents.renew_times("rot-1", 2.0)
    assert len(seen) >= 3, seen
    assert "renew_failing" not in agent.names()


def _rejected(client: Client) -> bool:
    try:
        client.merge_patch(node_lease_path(NS, "rot-1"), {})
    except Unauthorized:
        return True
    return False


@pytest.fixture
def trap() -> tuple[socket.socket, list[str]]:
    """A listening port that records every connection made to it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    hits: list[str] = []

    def accept() -> None:
        while sock.fileno() != -1:
            try:
                conn, _ = sock.accept()
                hits.append(conn.recv(200).decode(errors="replace"))
                conn.close()
            except (TimeoutError, OSError):
                continue

    threading.Thread(target=accept, daemon=True).start()
    return sock, hits


def test_ignores_in_cluster_service_and_proxies(
    agents: Agents, trap: tuple[socket.socket, list[str]]
) -> None:
    sock, hits = trap
    port = sock.getsockname()[1]
    agents.create_lease("env-1")
    env = agents.env(
        "env-1",
        KUBERNETES_SERVICE_HOST="127.0.0.1",
        KUBERNETES_SERVICE_PORT=str(port),
        HTTPS_PROXY=f"http://127.0.0.1:{port}",
        HTTP_PROXY=f"http://127.0.0.1:{port}",
        ALL_PROXY=f"http://127.0.0.1:{port}",
        https_proxy=f"http://127.0.0.1:{port}",
    )
    agents.start(env)
    wait_for(lambda: renewed(agents, "env-1"), 10, "renewals through DWD_APISERVER_URL")
    assert len(agents.renew_times("env-1", 1.1)) >= 2
    sock.close()
    assert hits == []


def test_outage_is_classified_logged_once_and_reported(agents: Agents, tmp_path: Path) -> None:
    """The URL points at a port where nothing listens, then a forwarder to the real server opens there."""
    kapi_port = agents.cp.url.rsplit(":", 1)[1]
    proxy = TcpProxy(upstream=("127.0.0.1", int(kapi_port))).open()
    metrics = free_port()
    try:
        port = proxy.port
        proxy.close()
        agents.create_lease("out-1")
        agent = agents.start(
            agents.env(
                "out-1",
                DWD_APISERVER_URL=f"https://localhost:{port}",
                DWD_METRICS_ADDR=f"127.0.0.1:{metrics}",
            )
        )
        wait_for(lambda: "renew_failing" in agent.names(), 10, "the outage to be noticed")
        time.sleep(2.0)  # four more failed renewals
        never_renewed = scrape(metrics)
        proxy.open()
        wait_for(lambda: renewed(agents, "out-1"), 10, "recovery")
        # The server has the renewal before the agent has read its answer and logged it.
        wait_for(lambda: "renew_recovered" in agent.names(), 10, "the recovery logged")
    finally:
        proxy.shutdown()
    names = agent.names()
    assert names.count("renew_failing") == 1
    assert names.count("renew_recovered") == 1
    failing = next(e for e in agent.events() if e["event"] == "renew_failing")
    assert failing["failure"] == "connect"
    lease = agents.lease("out-1")
    assert lease is not None
    outage = Outage.from_annotation(lease["metadata"]["annotations"][LAST_OUTAGE])
    assert outage.failure_class == "connect"
    assert 2.0 <= outage.duration_s < 15
    # The alert, on what the agent exported before its first renewal: its age is +Inf.
    late = {"severity": "warning", "pod": "out-1", "duration": "+Inf"}
    check(
        tmp_path,
        scraped(never_renewed, pod="out-1"),
        alert("1m", "DwdLeaseAgentNotRenewing"),
        alert("2m", "DwdLeaseAgentNotRenewing", late),
    )


def test_adopts_renew_interval_annotation(agents: Agents) -> None:
    agents.create_lease("ann-1")
    agents.start(agents.env("ann-1", DWD_RENEW_INTERVAL="1s"))
    wait_for(lambda: renewed(agents, "ann-1"), 10, "the first renewal")
    slow = agents.renew_times("ann-1", 3.0)
    agents.admin.merge_patch(
        node_lease_path(NS, "ann-1"), {"metadata": {"annotations": {RENEW_INTERVAL: "250ms"}}}
    )
    time.sleep(1.2)  # the agent reads it from its next PATCH response
    fast = agents.renew_times("ann-1", 3.0)
    assert len(slow) <= 4, slow
    assert len(fast) >= 9, fast


def test_bad_environment_fails_before_any_request(trap: tuple[socket.socket, list[str]]) -> None:
    sock, hits = trap
    env = {
        "DWD_APISERVER_URL": f"https://127.0.0.1:{sock.getsockname()[1]}",
        "NODE_NAME": "Bad_Node",
        "DWD_RENEW_INTERVAL": "fast",
        "DWD_TOKEN_FILE": "/nonexistent/token",
        "DWD_LOG_LEVEL": "chatty",
    }
    result = subprocess.run(
        [sys.executable, "-m", "agent"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2
    for name in ("NODE_NAME", "DWD_RENEW_INTERVAL", "DWD_TOKEN_FILE", "DWD_LOG_LEVEL"):
        assert f"  - {name}: " in result.stderr
    assert "DWD_APISERVER_URL" not in result.stderr  # the good one is not blamed
    time.sleep(0.3)
    sock.close()
    assert hits == []


def test_metrics_endpoint(agents: Agents, tmp_path: Path) -> None:
    kapi_port = agents.cp.url.rsplit(":", 1)[1]
    proxy = TcpProxy(upstream=("127.0.0.1", int(kapi_port))).open()
    port = free_port()
    try:
        agents.create_lease("met-1")
        url = f"https://localhost:{proxy.port}"
        agents.start(agents.env("met-1", DWD_APISERVER_URL=url, DWD_METRICS_ADDR=f"127.0.0.1:{port}"))
        wait_for(lambda: renewed(agents, "met-1"), 10, "the first renewal")
        time.sleep(1.2)
        values = samples(scrape(port))
        assert values["dwd_agent_renewals_total"] >= 2
        assert values["dwd_agent_renew_interval_seconds"] == 0.5
        # Each attempt's timings reach the metrics (the client's observer, wired by the root).
        assert values["dwd_agent_connections_opened_total"] >= 1
        assert values['dwd_agent_path_seconds_count{phase="request",connection="warm"}'] >= 1
        assert 0 <= values["dwd_agent_last_success_age_seconds"] < 1.0
        # The path breaks: the age the alert reads grows from the last renewal on.
        proxy.close()
        time.sleep(1.0)
        first, at = scrape(port), time.monotonic()
        time.sleep(2.0)
        then, apart_s = scrape(port), time.monotonic() - at
    finally:
        proxy.shutdown()
    age = "dwd_agent_last_success_age_seconds"
    start, end = samples(first)[age], samples(then)[age]
    assert end > start
    # At 1m the age is past 30 s and three intervals: pending, then firing 2 minutes on.
    exported = scraped(first, then, apart_s=apart_s, pod="met-1")
    step = (end - start) * 60.0 / apart_s
    check(
        tmp_path,
        exported,
        alert("2m", "DwdLeaseAgentNotRenewing"),
        alert(
            "3m",
            "DwdLeaseAgentNotRenewing",
            {"severity": "warning", "pod": "met-1", "duration": humanize_duration(start + 3 * step)},
        ),
    )
