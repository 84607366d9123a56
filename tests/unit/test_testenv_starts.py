"""The harness's one way to start an aggregator (testenv/worlds/aggregators.py) and an agent for
a node (testenv/worlds/agents.py): which variables each gets, and how it is started. The
programs are not run: what would start them is recorded."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from testenv.base import containers
from testenv.base.process import Process, ahead_on_the_cpu
from testenv.worlds import agents, aggregators
from testenv.worlds.agents import ByKubeconfig, ByUrl, agent_env
from testenv.worlds.aggregators import FromImage, FromSource, aggregator_env

KUBECONFIG = """apiVersion: v1
kind: Config
current-context: c
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
"""


def record(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[dict[str, Any]]:
    """Calls of ``module.name``, each as its arguments (positional ones as ``args``)."""
    calls: list[dict[str, Any]] = []

    def fake(*args: Any, **kwargs: Any) -> Process:
        calls.append({"args": args, **kwargs})
        return Process(str(args[0]) if args else "", None, Path("/dev/null"))  # type: ignore[arg-type]

    monkeypatch.setattr(module, name, fake)
    return calls


def test_what_the_aggregator_serves_comes_first_and_its_settings_may_override_it() -> None:
    env = aggregator_env(
        {"DWD_SHOOT_KUBECONFIG": "", "DWD_TARGETS": "gardener"},
        shoot_kubeconfig=Path("/shoot.yaml"),
        seed_kubeconfig=Path("/seed.yaml"),
    )
    # Gardener mode: no shoot kubeconfig, whatever the world offers; no namespace given.
    assert env == {"DWD_SHOOT_KUBECONFIG": "", "DWD_SEED_KUBECONFIG": "/seed.yaml", "DWD_TARGETS": "gardener"}


def test_an_aggregator_from_source_runs_its_module_with_every_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = record(monkeypatch, aggregators, "spawn_python")
    aggregators.start_aggregator(
        {"PATH": "/bin", "DWD_DRY_RUN": "true"},
        name="aggregator-0",
        log_path=tmp_path / "a.log",
        seed_kubeconfig=Path("/seed.yaml"),
        namespace="shoot--a--b",
        run=FromSource("tests.integration.planted_crash", tmp_path),
    )
    assert calls == [
        {
            "args": ("aggregator-0", "tests.integration.planted_crash"),
            "log_path": tmp_path / "a.log",
            "env": {
                "DWD_SEED_KUBECONFIG": "/seed.yaml",
                "DWD_NAMESPACE": "shoot--a--b",
                "PATH": "/bin",
                "DWD_DRY_RUN": "true",
            },
            "source": tmp_path,
        }
    ]


def test_an_aggregator_from_its_image_gets_the_files_its_variables_name_mounted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = record(monkeypatch, containers, "run")
    seed = tmp_path / "seed.yaml"
    seed.write_text(KUBECONFIG)
    files = tmp_path / "files"
    aggregators.start_aggregator(
        {"PATH": "/bin", "DWD_LOG_FORMAT": "json"},
        name="ignored for a container",
        log_path=tmp_path / "a.log",
        seed_kubeconfig=seed,
        run=FromImage("localhost/dwd-aggregator:dev", "dwd-aggregator-x-0", files),
    )
    [call] = calls
    assert call["args"] == ("localhost/dwd-aggregator:dev",)
    assert call["name"] == "dwd-aggregator-x-0" and call["network"] == "host"
    # The image's own PATH; the kubeconfig a copy in the mounted directory.
    assert call["env"] == {
        "DWD_SEED_KUBECONFIG": "/etc/dwd-lease/dwd_seed_kubeconfig.yaml",
        "DWD_LOG_FORMAT": "json",
    }
    assert call["mounts"] == {files: "/etc/dwd-lease"}
    assert (files / "dwd_seed_kubeconfig.yaml").is_file()


def test_an_agent_reaches_kapi_by_url_and_ca_or_by_the_kubelets_kubeconfig_never_both() -> None:
    by_url = agent_env("n-1", token_file=Path("/t"), server=ByUrl("https://kapi", Path("/ca")))
    assert by_url == {
        "NODE_NAME": "n-1",
        "DWD_TOKEN_FILE": "/t",
        "DWD_APISERVER_URL": "https://kapi",
        "DWD_CA_FILE": "/ca",
    }
    by_kubeconfig = agent_env(
        "n-1", token_file=Path("/t"), server=ByKubeconfig(Path("/kc")), env={"DWD_LOG_FORMAT": "json"}
    )
    assert by_kubeconfig == {
        "NODE_NAME": "n-1",
        "DWD_TOKEN_FILE": "/t",
        "DWD_KUBELET_KUBECONFIG": "/kc",
        "DWD_LOG_FORMAT": "json",
    }


class FakeNs:
    def argv(self, command: list[str]) -> list[str]:
        return ["ip", "netns", "exec", "ns-1", *command]


def test_an_agent_in_a_namespace_runs_through_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    on_host = record(monkeypatch, agents, "spawn_python")
    in_ns = record(monkeypatch, agents, "spawn")
    server = ByUrl("https://kapi", Path("/ca"))
    agents.start_agent("n-1", token_file=Path("/t"), server=server, log_path=tmp_path / "1.log")
    agents.start_agent(
        "n-2",
        token_file=Path("/t"),
        server=server,
        log_path=tmp_path / "2.log",
        name="agent-two",
        netns=FakeNs(),  # type: ignore[arg-type]
    )
    assert [(c["args"], c["source"]) for c in on_host] == [(("agent-n-1", "agent"), None)]
    assert [c["args"] for c in in_ns] == [
        ("agent-two", ["ip", "netns", "exec", "ns-1", sys.executable, "-m", "agent"])
    ]
    assert in_ns[0]["env"]["NODE_NAME"] == "n-2"


def test_a_world_ahead_on_the_cpu_takes_its_threads_and_processes_along() -> None:
    """As root (CI): the thread, a thread it starts and a process it starts run at nice -10,
    and the thread is back at its own after. Elsewhere: nothing changes, and it says so."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen: list[int] = []
    with ahead_on_the_cpu(-10) as raised:
        thread = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
        thread.start()
        thread.join()
        child = subprocess.run(
            ["sh", "-c", "cut -d' ' -f19 /proc/self/stat"], check=True, capture_output=True, text=True
        )
    want = -10 if os.geteuid() == 0 else before
    assert raised == (os.geteuid() == 0)
    assert seen == [want]
    assert int(child.stdout) == want
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
