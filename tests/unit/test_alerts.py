"""The alerting rules (manifests/monitoring/prometheusrule.yaml) run by promtool on series the
tests write: each alert fires where it should and not where a standby's view or a passing
blip would make it (on what the real processes export: tests/integration/test_alerts_scraped.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from aggregator.ops.metrics import AggregatorMetrics
from tests.alerting import PROMTOOL, RULES, alert, needs_promtool, promtool, rules, series

pytestmark = needs_promtool


def test_the_rules_are_valid_prometheus_rules(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules()["spec"]["groups"]}))
    out = subprocess.run(
        [PROMTOOL, "check", "rules", str(tmp_path / "rules.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "8 rules found" in out.stdout


def test_a_scale_down_alerts_on_the_replica_that_acts_and_not_on_a_standbys_view(tmp_path: Path) -> None:
    """t1: scaled down where it is led. t2: a standby judges it scaled down while the leader's
    interlocks refused (a standby checks none): no alert. t3: led by a replica in dry-run,
    which scales nothing: no alert. t4: in its own dry run (its providerConfig) under a replica
    that scales others: no alert."""
    phase, leading = "dwd_target_phase", "dwd_target_leading"
    out = promtool(
        tmp_path,
        {
            "interval": "1m",
            "input_series": [
                series(phase, "0 0 1x14", instance="a", target="t1", phase="scaled-down"),
                series(leading, "1x16", instance="a", target="t1"),
                series(phase, "0 0 1x14", instance="b", target="t1", phase="scaled-down"),
                series(leading, "0x16", instance="b", target="t1"),
                series(phase, "0x16", instance="a", target="t2", phase="scaled-down"),
                series(leading, "1x16", instance="a", target="t2"),
                series(phase, "1x16", instance="b", target="t2", phase="scaled-down"),
                series(leading, "0x16", instance="b", target="t2"),
                series(phase, "1x16", instance="c", target="t3", phase="scaled-down"),
                series(leading, "1x16", instance="c", target="t3"),
                series("dwd_target_dry_run", "0x16", instance="a", target="t1"),
                series("dwd_target_dry_run", "0x16", instance="b", target="t1"),
                series("dwd_target_dry_run", "0x16", instance="a", target="t2"),
                series("dwd_target_dry_run", "0x16", instance="b", target="t2"),
                series("dwd_target_dry_run", "1x16", instance="c", target="t3"),
                # t4: its own providerConfig's dry run, under a replica that acts for others.
                series(phase, "1x16", instance="a", target="t4", phase="scaled-down"),
                series(leading, "1x16", instance="a", target="t4"),
                series("dwd_target_dry_run", "1x16", instance="a", target="t4"),
            ],
            "alert_rule_test": [
                alert("1m", "DwdLeaseShootScaledDown"),
                alert("3m", "DwdLeaseShootScaledDown", {"severity": "warning", "target": "t1"}),
                alert("11m", "DwdLeaseShootScaledDownLong"),
                alert("13m", "DwdLeaseShootScaledDownLong", {"severity": "critical", "target": "t1"}),
            ],
        },
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_silent_agents_unsynced_and_unled_targets_alert_after_their_time(tmp_path: Path) -> None:
    out = promtool(
        tmp_path,
        {
            "interval": "1m",
            "input_series": [
                series("dwd_target_agent_silent_path_alive", "3x10", instance="a", target="t1"),
                series("dwd_target_leading", "1x10", instance="a", target="t1"),
                # t2: the replica acting for it has no fresh view, a standby's is: unprotected.
                # t3: the acting replica's view is fresh, a standby's is not: protected.
                series("dwd_target_synced", "0x10", instance="a", target="t2"),
                series("dwd_target_leading", "1x10", instance="a", target="t2"),
                series("dwd_target_synced", "1x10", instance="b", target="t2"),
                series("dwd_target_leading", "0x10", instance="b", target="t2"),
                series("dwd_target_synced", "1x10", instance="a", target="t3"),
                series("dwd_target_leading", "1x10", instance="a", target="t3"),
                series("dwd_target_synced", "0x10", instance="b", target="t3"),
                series("dwd_target_leading", "0x10", instance="b", target="t3"),
                # t5: its Secret unusable, it never starts: only its errors are there.
                series("dwd_target_errors_total", "0 1 2 3 4 5 6 7 8 9 10", instance="a", target="t5"),
                series("dwd_target_leading", "0x10", instance="a", target="t4"),
                series("dwd_target_leading", "0x10", instance="b", target="t4"),
            ],
            "alert_rule_test": [
                alert("4m", "DwdLeaseAgentsSilentPathAlive"),
                alert(
                    "6m",
                    "DwdLeaseAgentsSilentPathAlive",
                    {"severity": "warning", "target": "t1", "value": "3"},
                ),
                alert("4m", "DwdLeaseTargetNotSynced"),
                alert("6m", "DwdLeaseTargetNotSynced", {"severity": "warning", "target": "t2"}),
                alert("5m", "DwdLeaseTargetFailing"),
                alert("7m", "DwdLeaseTargetFailing", {"severity": "warning", "target": "t5"}),
                alert("1m", "DwdLeaseTargetUnled"),
                alert("3m", "DwdLeaseTargetUnled", {"severity": "critical", "target": "t4"}),
            ],
        },
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_leadership_flapping_and_an_agent_that_stopped_renewing_alert(tmp_path: Path) -> None:
    out = promtool(
        tmp_path,
        {
            "interval": "1m",
            "input_series": [
                # Two replicas trading the lease every minute from minute 4.
                series("dwd_leader", "1 1 1 1 0 1 0 1 0 1 0 1 0", instance="a"),
                series("dwd_leader", "0 0 0 0 1 0 1 0 1 0 1 0 1", instance="b"),
                # One agent quiet from minute 2 (a blip of 20 s before that), another renewing,
                # a third outside the sample, renewing every 2 minutes: 100 s is on time there.
                series("dwd_agent_last_success_age_seconds", "1 20 45 45 45 45", pod="agent-x"),
                series("dwd_agent_renew_interval_seconds", "2x5", pod="agent-x"),
                series("dwd_agent_last_success_age_seconds", "1x5", pod="agent-y"),
                series("dwd_agent_renew_interval_seconds", "2x5", pod="agent-y"),
                series("dwd_agent_last_success_age_seconds", "100x5", pod="agent-z"),
                series("dwd_agent_renew_interval_seconds", "120x5", pod="agent-z"),
            ],
            "alert_rule_test": [
                # Each replica's changes: 4 by minute 7 (not yet), 5 by minute 8.
                alert("7m", "DwdLeaseLeadershipFlapping"),
                alert("8m", "DwdLeaseLeadershipFlapping", {"severity": "warning", "value": "5"}),
                alert("3m", "DwdLeaseAgentNotRenewing"),
                alert(
                    "4m",
                    "DwdLeaseAgentNotRenewing",
                    {"severity": "warning", "pod": "agent-x", "duration": "45s"},
                ),
            ],
        },
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- the dashboard (manifests/monitoring/dashboard.json)

DASHBOARD = RULES.parent / "dashboard.json"


def panels(shoot: str = ".*") -> dict[str, str]:
    """Every query of the dashboard by its panel's title (and its letter where a panel has more),
    with the shoot variable as Grafana fills it in (All: ``.*``)."""
    board = json.loads(DASHBOARD.read_text())
    out = {}
    for p in board["panels"]:
        for t in p["targets"]:
            title = p["title"] if len(p["targets"]) == 1 else f"{p['title']} {t['refId']}"
            out[title] = t["expr"].replace("$target", shoot)
    return out


def test_every_panel_says_what_it_shows_and_a_shoots_panels_follow_the_shoot_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert any(v["name"] == "target" for v in board["templating"]["list"])
    for p in board["panels"]:
        assert len(p.get("description", "")) > 20, p["title"]
        for t in p["targets"]:
            per_target = "dwd_target_" in t["expr"] or "dwd_scale" in t["expr"] or "dwd_watch" in t["expr"]
            assert not per_target or 'target=~"$target"' in t["expr"], p["title"]


def test_every_panel_is_valid_promql_on_metrics_the_aggregator_exports(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    exported = set(re.findall(r"^# TYPE (\S+)", AggregatorMetrics().registry.render(), re.MULTILINE))
    assert "dwd_target_phase" in exported
    for title, expr in panels().items():
        named = {n.removesuffix("_bucket") for n in re.findall(r"\bdwd_[a-z_]+", expr)}
        assert named <= exported, f"{title}: {named - exported} not exported"
    # promtool checks PromQL as rules only: each panel as a recording rule.
    recorded = [{"record": f"dashboard:panel_{i}", "expr": e} for i, e in enumerate(panels().values())]
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": recorded}]}))
    out = subprocess.run(
        [PROMTOOL, "check", "rules", str(tmp_path / "panels.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_phase_panel_counts_each_shoot_once_from_the_replica_that_acts_for_it(tmp_path: Path) -> None:
    """Two replicas, three shoots: the standby's phases are not added to the leader's."""
    assert PROMTOOL is not None
    expr = panels()["Shoots by phase (where acted for)"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": []}))
    inputs = []
    for target, leader_phase, standby_phase in [
        ("t1", "healthy", "healthy"),
        ("t2", "scaled-down", "scaled-down"),
        ("t3", "confirming", "scaled-down"),
    ]:
        for instance, phase, lead in (("a", leader_phase, "1"), ("b", standby_phase, "0")):
            for p in ("healthy", "confirming", "scaled-down"):
                inputs.append(
                    series(
                        "dwd_target_phase",
                        "1" if p == phase else "0",
                        instance=instance,
                        target=target,
                        phase=p,
                    )
                )
            inputs.append(series("dwd_target_leading", lead, instance=instance, target=target))
    test = {
        "interval": "1m",
        "input_series": inputs,
        "promql_expr_test": [
            {
                "expr": expr,
                "eval_time": "0m",
                "exp_samples": [
                    {"labels": '{phase="healthy"}', "value": 1},
                    {"labels": '{phase="confirming"}', "value": 1},
                    {"labels": '{phase="scaled-down"}', "value": 1},
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [test]}))
    out = subprocess.run(
        [PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
