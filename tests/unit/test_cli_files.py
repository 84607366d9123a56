"""Bad files the aggregator is given stop its start with exit 2 and one line that names the
variable, the file and what is wrong with it."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SEED = """apiVersion: v1
kind: Config
clusters: [{name: seed, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: seed, user: u}}]
current-context: c
"""


def start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aggregator"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_seed_kubeconfig_that_is_not_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "seed.yaml"
    bad.write_text(": : : [\n")
    out = start({"DWD_TARGETS": "gardener", "DWD_SEED_KUBECONFIG": str(bad)})
    assert out.returncode == 2, out
    assert f"DWD_SEED_KUBECONFIG: kubeconfig {bad}: not valid YAML (line 1, column 1:" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 2, out.stderr  # the header and one line


def test_a_targets_file_that_is_malformed_at_start(tmp_path: Path) -> None:
    seed, targets = tmp_path / "seed.yaml", tmp_path / "targets.yaml"
    seed.write_text(SEED)
    targets.write_text("targets: {namespace: shoot--p--a}\n")
    out = start({"DWD_TARGETS": f"file:{targets}", "DWD_SEED_KUBECONFIG": str(seed)})
    assert out.returncode == 2, out
    assert f"DWD_TARGETS: targets file {targets}: expected a list under 'targets'" in out.stderr


def test_status_says_when_the_targets_are_unavailable_and_exits_1(tmp_path: Path) -> None:
    """A running aggregator whose targets file broke: ``status`` prints what it has and why the
    targets are missing, and fails (a script's check must not read an empty table as fine)."""
    status = {"identity": "a", "leader": True, "dry_run": False, "targets": [], "source_error": "bad file"}

    out = _status_against(_http(json.dumps(status).encode()))
    assert out.returncode == 1, out
    assert "the targets are unavailable: bad file" in out.stderr


def _status_against(answer: bytes) -> subprocess.CompletedProcess[str]:
    """``status`` against a server that answers ``answer`` to anything, raw."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    try:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "aggregator",
                "status",
                "--url",
                f"http://127.0.0.1:{listener.getsockname()[1]}",
            ],
            env={"PATH": "/usr/bin:/bin", "NO_PROXY": "*"},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        listener.close()


def _http(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "BadStatusLine"),  # not an HTTP port
        (_http(b"[1, 2, 3]"), "not an aggregator's /status"),  # JSON, not an object
        (_http(b'{"targets": [1]}'), "not an aggregator's /status"),  # someone else's object
        (_http(b"<html>"), "JSONDecodeError"),
    ],
)
def test_status_against_something_else_says_so_in_one_line(answer: bytes, said: str) -> None:
    """Before, a non-HTTP port or JSON that is not a status object ended in a traceback."""
    out = _status_against(answer)
    assert out.returncode == 1, out
    assert said in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
