from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.settings import Settings
from core.config import ConfigError


@pytest.fixture
def token(tmp_path: Path) -> str:
    p = tmp_path / "token"
    p.write_text("t0ken\n")
    return str(p)


def test_defaults(token: str) -> None:
    s = Settings.from_env(
        {"DWD_APISERVER_URL": "https://api.shoot.example/", "NODE_NAME": "n1", "DWD_TOKEN_FILE": token}
    )
    assert s.apiserver_url == "https://api.shoot.example"
    assert (s.lease_namespace, s.renew_interval_s, s.ca_file) == ("kube-system", 2.0, "")
    assert s.metrics_addr is None
    assert s.legacy_namespace == "dwd-node-lease"  # a move from the old layout is followed
    env = {"DWD_APISERVER_URL": "https://a.example", "NODE_NAME": "n1", "DWD_TOKEN_FILE": token}
    assert Settings.from_env({**env, "DWD_LEGACY_LEASE_NAMESPACE": "-"}).legacy_namespace == ""
    with pytest.raises(ConfigError, match="DWD_LEGACY_LEASE_NAMESPACE"):
        Settings.from_env({**env, "DWD_LEGACY_LEASE_NAMESPACE": "Bad_Name"})
    with pytest.raises(ConfigError, match=r"NODE_NAME: a{40}\.\.\. has 239 characters"):
        Settings.from_env({**env, "NODE_NAME": "a" * 239})


def test_every_bad_variable_is_named_in_one_error(tmp_path: Path) -> None:
    env = {
        "DWD_APISERVER_URL": "http://api.shoot.example",
        "NODE_NAME": "Not_A_Node",
        "DWD_LEASE_NAMESPACE": "Bad.Namespace",
        "DWD_RENEW_INTERVAL": "2 seconds",
        "DWD_TOKEN_FILE": str(tmp_path / "missing"),
        "DWD_CA_FILE": str(tmp_path / "missing-ca"),
        "DWD_METRICS_ADDR": "nowhere",
        "DWD_LOG_FORMAT": "xml",
        "DWD_LOG_LEVEL": "loud",
    }
    with pytest.raises(ConfigError) as e:
        Settings.from_env(env)
    named = {p.split(":")[0] for p in e.value.problems}
    assert named == set(env)


def test_required_variables(token: str, tmp_path: Path) -> None:
    """Without DWD_APISERVER_URL the kubelet kubeconfig is required."""
    missing = tmp_path / "kubeconfig-real"
    with pytest.raises(ConfigError) as e:
        Settings.from_env({"DWD_TOKEN_FILE": token, "DWD_KUBELET_KUBECONFIG": str(missing)})
    assert e.value.problems == [
        f"DWD_KUBELET_KUBECONFIG: {missing}: No such file or directory (or set DWD_APISERVER_URL)",
        "NODE_NAME: is required",
    ]


def test_a_retired_setting_is_ignored_not_fatal(token: str) -> None:
    """An upgrade that kept DWD_REQUEST_TIMEOUT must not stop the agent on every node."""
    env = {"DWD_APISERVER_URL": "https://a.example", "NODE_NAME": "n1", "DWD_TOKEN_FILE": token}
    s = Settings.from_env({**env, "DWD_REQUEST_TIMEOUT": "200ms"})
    assert dataclasses.replace(s, deprecated=()) == Settings.from_env(env)
    assert s.deprecated == (
        "DWD_REQUEST_TIMEOUT: no longer read (a renewal may now take twice the interval, at most 10s "
        "(docs/agent.md)): remove it",
    )


def test_interval_range(token: str) -> None:
    base = {"DWD_APISERVER_URL": "https://a.example", "NODE_NAME": "n1", "DWD_TOKEN_FILE": token}
    with pytest.raises(ConfigError, match="DWD_RENEW_INTERVAL: 10ms is out of range"):
        Settings.from_env({**base, "DWD_RENEW_INTERVAL": "10ms"})


def test_an_unknown_setting_is_kept_to_warn_about_not_fatal(token: str) -> None:
    """An agent rolled back under newer manifests must keep renewing on every node."""
    env = {
        "DWD_APISERVER_URL": "https://api.shoot.example",
        "NODE_NAME": "n1",
        "DWD_TOKEN_FILE": token,
        "DWD_APISERVER_ULR": "https://typo.example",
        "DWD_KUBELET_KUBECONFIG": "/etc/ignored-when-the-url-is-set",
        "DWD_REQUEST_TIMEOUT": "5s",  # retired: warned about on its own
    }
    s = Settings.from_env(env)
    assert s.unknown == ("DWD_APISERVER_ULR: not a setting (did you mean DWD_APISERVER_URL?)",)


@pytest.mark.parametrize(
    ("service", "server_or_problem"),
    [
        # Gardener's kubernetes-service-host webhook: the API server's internal domain.
        (
            {"KUBERNETES_SERVICE_HOST": "api.s.p.internal.example.com"},
            "https://api.s.p.internal.example.com:443",
        ),
        (
            {"KUBERNETES_SERVICE_HOST": "api.s.p.internal.example.com", "KUBERNETES_SERVICE_PORT": "8443"},
            "https://api.s.p.internal.example.com:8443",
        ),
        ({}, "DWD_APISERVER_FROM: kubernetes-service-host: KUBERNETES_SERVICE_HOST is not set"),
        # The cluster's own Service: the in-cluster path, not the one the kubelet takes.
        ({"KUBERNETES_SERVICE_HOST": "100.64.0.1"}, "is 100.64.0.1, an address: the cluster's Service"),
        ({"KUBERNETES_SERVICE_HOST": "fd00::1"}, "is fd00::1, an address"),
        (
            {"KUBERNETES_SERVICE_HOST": "api.example", "KUBERNETES_SERVICE_PORT": "https"},
            "DWD_APISERVER_FROM: ",
        ),
    ],
)
def test_the_server_may_come_from_the_name_gardener_gives_every_pod(
    token: str, service: dict[str, str], server_or_problem: str
) -> None:
    """Without the kubelet's kubeconfig (no root, no hostPath): the host Gardener's resource
    manager injects, which is the kubelet's own name for KAPI; never an address."""
    env = {"DWD_APISERVER_FROM": "kubernetes-service-host", "NODE_NAME": "n1", "DWD_TOKEN_FILE": token}
    env |= {"DWD_KUBELET_KUBECONFIG": "/nonexistent"} | service  # not read in this mode
    if server_or_problem.startswith("https://"):
        s = Settings.from_env(env)
        assert (s.apiserver_url, s.kubelet_kubeconfig, s.unknown) == (server_or_problem, "", ())
        return
    with pytest.raises(ConfigError) as e:
        Settings.from_env(env)
    assert len(e.value.problems) == 1 and server_or_problem in e.value.problems[0]


def test_an_explicit_url_wins_over_the_service_host(token: str) -> None:
    env = {"DWD_APISERVER_FROM": "kubernetes-service-host", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    s = Settings.from_env(
        {**env, "DWD_APISERVER_URL": "https://api.x", "NODE_NAME": "n1", "DWD_TOKEN_FILE": token}
    )
    assert s.apiserver_url == "https://api.x"
    with pytest.raises(ConfigError, match="DWD_APISERVER_FROM: 'kubelet' is not one of"):
        Settings.from_env({"DWD_APISERVER_FROM": "kubelet", "NODE_NAME": "n1", "DWD_TOKEN_FILE": token})
