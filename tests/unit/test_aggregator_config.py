from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import yaml

from aggregator.kube.endpoint import load_kubeconfig
from aggregator.model.backoff import Backoff
from aggregator.model.dependents import DEFAULT_DEPENDENTS, Direction, levels, load_dependents
from aggregator.model.settings import DeciderSettings, LeaderSettings, Settings, ShootSettings, WatchSettings
from core.errors import ConfigError, KubeconfigError


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    p = tmp_path / "kubeconfig"
    p.write_text("apiVersion: v1\nkind: Config\n")
    return str(p)


def test_defaults(kubeconfig: str) -> None:
    s = Settings.from_env({"DWD_SHOOT_KUBECONFIG": kubeconfig, "DWD_NAMESPACE": "shoot--p--s"})
    d = s.decider
    assert (d.lease_duration_s, d.confirm_period_s, d.failure_fraction, d.recovery_fraction) == (
        6.0,
        3.0,
        0.6,
        0.4,
    )
    assert (d.min_candidates, s.provisioning.lease_namespace, s.scaling.dry_run, s.shoots.mode) == (
        2,
        "kube-system",
        False,
        "env",
    )
    assert d.tick_s == 1.0
    assert s.provisioning.legacy_namespace == "dwd-node-lease"
    assert s.shoots.shoot_server == "https://kube-apiserver.{namespace}.svc"
    env = {"DWD_SHOOT_KUBECONFIG": kubeconfig, "DWD_NAMESPACE": "shoot--p--s"}
    assert Settings.from_env({**env, "DWD_LEGACY_LEASE_NAMESPACE": "-"}).provisioning.legacy_namespace == ""
    with pytest.raises(ConfigError, match=r"DWD_SHOOT_SERVER: 'http://x' is not https://HOST\[:PORT\]"):
        Settings.from_env({**env, "DWD_SHOOT_SERVER": "http://x"})


def test_every_bad_variable_is_named(tmp_path: Path) -> None:
    env = {
        "DWD_SHOOT_KUBECONFIG": str(tmp_path / "nope"),
        "DWD_SEED_KUBECONFIG": str(tmp_path / "nope2"),
        "DWD_NAMESPACE": "Not Valid",
        "DWD_LEASE_NAMESPACE": "x_y",
        "DWD_LEASE_DURATION": "forever",
        "DWD_NODE_GRACE": "1 minute",
        "DWD_FAILURE_FRACTION": "1.5",
        "DWD_RECOVERY_FRACTION": "abc",
        "DWD_CONFIRM_PERIOD": "-",
        "DWD_RECOVERY_PERIOD": "10",
        "DWD_MIN_CANDIDATES": "0",
        "DWD_DEPENDENTS_FILE": str(tmp_path / "deps"),
        "DWD_TARGETS": "somewhere",
        "DWD_DRY_RUN": "perhaps",
        "DWD_LEADER_ELECTION": "2",
        "DWD_METRICS_ADDR": "8080",
        "DWD_WRITE_BUDGET": "-1",
        "DWD_LOG_FORMAT": "yaml",
        "DWD_LOG_LEVEL": "trace",
        "DWD_NODE_CONDITIONS": "[DiskPressure]",
    }
    with pytest.raises(ConfigError) as e:
        Settings.from_env(env)
    assert {p.split(":")[0] for p in e.value.problems} == set(env)


def test_relations(kubeconfig: str) -> None:
    base = {"DWD_SHOOT_KUBECONFIG": kubeconfig, "DWD_NAMESPACE": "ns"}
    with pytest.raises(ConfigError, match=r"DWD_RECOVERY_FRACTION: 0\.7 must not exceed"):
        Settings.from_env({**base, "DWD_RECOVERY_FRACTION": "0.7"})
    with pytest.raises(
        ConfigError, match=r"DWD_LEASE_DURATION: 3s must be at least twice DWD_RENEW_INTERVAL \(2s\)"
    ):
        Settings.from_env({**base, "DWD_LEASE_DURATION": "3s", "DWD_RENEW_INTERVAL": "2s"})


def test_default_dependents_follow_dependency_watchdog() -> None:
    assert [[d.name for d in lv] for lv in levels(DEFAULT_DEPENDENTS, Direction.DOWN)] == [
        ["machine-controller-manager", "cluster-autoscaler"],
        ["kube-controller-manager"],
    ]
    assert [[d.name for d in lv] for lv in levels(DEFAULT_DEPENDENTS, Direction.UP)] == [
        ["kube-controller-manager"],
        ["machine-controller-manager"],
        ["cluster-autoscaler"],
    ]


def test_dependents_file(tmp_path: Path) -> None:
    p = tmp_path / "deps.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "dependentResourceInfos": [
                    {
                        "ref": {"kind": "Deployment", "name": "kcm", "apiVersion": "apps/v1"},
                        "scaleUp": {"level": 0, "initialDelay": "10s", "timeout": "1m"},
                        "scaleDown": {"level": 1},
                    }
                ]
            }
        )
    )
    (d,) = load_dependents(str(p))
    assert (d.name, d.optional, d.scale_up.initial_delay_s, d.scale_up.timeout_s, d.scale_down.level) == (
        "kcm",
        False,
        10.0,
        60.0,
        1,
    )
    assert d.path("ns") == "/apis/apps/v1/namespaces/ns/deployments/kcm"


def test_bad_dependents_name_each_entry(tmp_path: Path) -> None:
    p = tmp_path / "deps.yaml"
    p.write_text(
        yaml.safe_dump(
            [
                {"ref": {"name": "a", "kind": "DaemonSet"}, "scaleUp": {}, "scaleDown": {}},
                {"ref": {"name": "b"}, "scaleUp": {"level": -1}, "scaleDown": {}},
                {"ref": {"name": "c"}, "scaleUp": {"initialDelay": "soon"}, "scaleDown": {}},
                {"ref": {}},
            ]
        )
    )
    with pytest.raises(ConfigError) as e:
        load_dependents(str(p))
    text = str(e.value)
    for i, what in enumerate(["DaemonSet is not supported", "level must be", "invalid duration", "ref.name"]):
        assert f"entry {i}: " in text
        assert what in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("key: [unclosed", "not valid YAML (line 1, column 15"),
        ("- a list", "not a kubeconfig"),
        ("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n", "kubeconfig"),
        (
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters: [{name: k, cluster: {server: 'http://plain:80'}}]\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n",
            "is not an https URL",
        ),
        (
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters: [{name: k, cluster: {server: 'https://a:443'}}]\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {}}]\n",
            "no token, tokenFile, exec plugin or client certificate",
        ),
        (
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters: [{name: k, cluster: {server: 'https://a:443'}}]\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
            "users: [{name: u, user: {auth-provider: {name: oidc, config: {}}}}]\n",
            "auth-provider 'oidc' is not supported",
        ),
        ("server: caf\udce9", "not UTF-8 text (byte b'\\xe9' at offset 11)"),
    ],
)
def test_bad_kubeconfig_names_the_file(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "kc"
    p.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(KubeconfigError) as e:
        load_kubeconfig(p)
    assert str(p) in str(e.value)
    assert message in str(e.value)


EXEC_PLUGIN = """#!{python}
# An exec credential plugin whose token rotates: a new one on every run, valid {valid_s} s.
import datetime, json, pathlib
runs = pathlib.Path({runs!r})
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds={valid_s})
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
    "status": {{"token": f"token-{{n}}", "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ")}}}}))
"""


def _exec_kubeconfig(tmp_path: Path, valid_s: int) -> tuple[Path, Path]:
    plugin, runs = tmp_path / "plugin", tmp_path / "runs"
    plugin.write_text(EXEC_PLUGIN.format(python=sys.executable, runs=str(runs), valid_s=valid_s))
    plugin.chmod(0o755)
    kc = tmp_path / "kc"
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": str(plugin),
        "interactiveMode": "Never",
    }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://a:443"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"exec": exec_}}],
    }
    kc.write_text(yaml.safe_dump(config))
    return kc, runs


def test_an_exec_plugins_token_is_renewed_before_it_expires(tmp_path: Path) -> None:
    """The kubernetes loader's refresh hook runs the plugin again once its token is within five
    minutes of expiry: a token valid 1 s is renewed on every use, one valid 1 h is kept."""
    kc, runs = _exec_kubeconfig(tmp_path, valid_s=1)
    token = load_kubeconfig(kc).token
    first, second = token(), token()
    assert first != second and (first, second) == (
        f"token-{int(runs.read_text()) - 1}",
        f"token-{runs.read_text()}",
    )
    (tmp_path / "long").mkdir()
    kc, runs = _exec_kubeconfig(tmp_path / "long", valid_s=3600)
    token = load_kubeconfig(kc).token
    assert token() == token() == "token-1" and runs.read_text() == "1"


def test_each_group_checks_its_own_relations_wherever_it_is_built(kubeconfig: str) -> None:
    with pytest.raises(ConfigError, match="DWD_LEADER_RENEW_DEADLINE: needs"):
        LeaderSettings(lease_duration_s=10.0, renew_deadline_s=10.0)
    with pytest.raises(ConfigError, match=r"DWD_BLIND_LIMIT: 4s must be at least DWD_LEASE_DURATION \(6s\)"):
        DeciderSettings(blind_limit_s=4.0)
    base = {"DWD_SHOOT_KUBECONFIG": kubeconfig, "DWD_NAMESPACE": "ns"}
    with pytest.raises(ConfigError, match="DWD_LEADER_RENEW_DEADLINE: needs") as e:
        Settings.from_env({**base, "DWD_LEADER_RETRY_PERIOD": "10s", "DWD_BLIND_LIMIT": "5s"})
    assert {p.split(":")[0] for p in e.value.problems} == {"DWD_LEADER_RENEW_DEADLINE", "DWD_BLIND_LIMIT"}


def test_the_back_off_schedules_keep_their_numbers() -> None:
    def first(backoff: Backoff, n: int) -> list[float]:
        return list(itertools.islice(backoff.delays(), n))

    assert first(WatchSettings().backoff, 6) == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert first(ShootSettings().restart, 7) == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    spread = [WatchSettings().backoff.spread(1.0) for _ in range(200)]
    assert 0.8 <= min(spread) < max(spread) <= 1.2
    assert ShootSettings().restart.spread(4.0) == 4.0


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("DWD_DRYRUN", "DWD_DRY_RUN"),
        ("DWD_RENEW_INTERVALL", "DWD_RENEW_INTERVAL"),
        ("DWD_FAILURE_FRACTON", "DWD_FAILURE_FRACTION"),
    ],
)
def test_an_unknown_setting_refuses_the_start_naming_the_nearest(
    kubeconfig: str, typo: str, meant: str
) -> None:
    """``DWD_DRYRUN=true`` ignored would scale for real where the operator asked for dry-run."""
    env = {"DWD_SHOOT_KUBECONFIG": kubeconfig, "DWD_NAMESPACE": "shoot--p--s", typo: "true"}
    with pytest.raises(ConfigError) as e:
        Settings.from_env(env)
    assert f"{typo}: not a setting (did you mean {meant}?)" in str(e.value)


def test_every_setting_the_aggregator_reads_is_known_in_every_mode(kubeconfig: str, tmp_path: Path) -> None:
    """No variable of ours is taken for a typo, whichever mode reads it."""
    from core.config import EnvReader, settings_help

    names = [line.split()[0] for line in settings_help(Settings.read).splitlines()]
    targets = tmp_path / "targets.yaml"
    targets.write_text("[]\n")
    for mode in ("env", f"file:{targets}", "gardener"):
        env = dict.fromkeys(names, "") | {"DWD_TARGETS": mode, "DWD_SHOOT_KUBECONFIG": kubeconfig}
        env["DWD_NAMESPACE"] = "shoot--p--s"
        r = EnvReader(env)
        Settings.read(r)
        assert r.unknown() == [], mode


def test_a_value_out_of_range_is_blamed_alone_with_what_is_allowed(kubeconfig: str) -> None:
    env = {
        "DWD_SHOOT_KUBECONFIG": kubeconfig,
        "DWD_NAMESPACE": "shoot--p--s",
        "DWD_CONFIRM_PERIOD": "-1s",
        "DWD_FAILURE_FRACTION": "-1",
    }
    with pytest.raises(ConfigError) as e:
        Settings.from_env(env)
    assert sorted(e.value.problems) == [  # DWD_RECOVERY_FRACTION, not set, is not blamed
        "DWD_CONFIRM_PERIOD: -1s is out of range (at least 0s)",
        "DWD_FAILURE_FRACTION: -1 is not a fraction in (0, 1]",
    ]


def test_a_relation_error_shows_the_values(kubeconfig: str) -> None:
    env = {
        "DWD_SHOOT_KUBECONFIG": kubeconfig,
        "DWD_NAMESPACE": "shoot--p--s",
        "DWD_RENEW_INTERVAL": "5s",
    }
    with pytest.raises(ConfigError) as e:
        Settings.from_env(env)
    assert "DWD_LEASE_DURATION: 6s must be at least twice DWD_RENEW_INTERVAL (5s)" in str(e.value)
