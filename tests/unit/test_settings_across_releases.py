"""A setting the release before read under another name is still read under it for one release,
and one it no longer reads is accepted, each with a warning that says what to do: the typo check
must not turn an upgrade (or a rollback under newer manifests) into a crash loop. The tables
(RENAMED, RETIRED of each program) are empty where nothing changed; the rule is checked with
an entry planted in them."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.model import settings as aggregator_settings
from core.config import EnvReader
from core.errors import ConfigError


def test_a_renamed_setting_is_read_under_its_old_name_with_a_warning() -> None:
    r = EnvReader({"DWD_OLD_GRACE": "5s"}, renamed={"DWD_OLD_GRACE": "DWD_NODE_GRACE"})
    assert r.duration("DWD_NODE_GRACE", "0s") == 5.0
    assert r.unknown() == []
    assert r.deprecated() == [
        "DWD_OLD_GRACE: renamed DWD_NODE_GRACE, read as DWD_NODE_GRACE for this release: rename it"
    ]


def test_the_new_name_wins_when_both_are_set() -> None:
    r = EnvReader(
        {"DWD_OLD_GRACE": "5s", "DWD_NODE_GRACE": "7s"}, renamed={"DWD_OLD_GRACE": "DWD_NODE_GRACE"}
    )
    assert r.duration("DWD_NODE_GRACE", "0s") == 7.0
    assert r.deprecated() == [
        "DWD_OLD_GRACE: renamed DWD_NODE_GRACE, which is set too and is the one read: remove DWD_OLD_GRACE"
    ]


def test_a_retired_setting_is_accepted_and_said_so() -> None:
    r = EnvReader({"DWD_GONE": "1"}, retired={"DWD_GONE": "the verdict no longer needs it"})
    assert r.unknown() == []
    assert r.deprecated() == ["DWD_GONE: no longer read (the verdict no longer needs it): remove it"]


def test_the_aggregator_reads_a_renamed_setting_and_still_refuses_a_typo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its unknown variables stay fatal (a typo'd DWD_DRY_RUN would scale for real); one of the
    release before is not unknown."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    env = {"DWD_SHOOT_KUBECONFIG": str(kubeconfig), "DWD_NAMESPACE": "shoot--p--s", "DWD_DRYRUN_OLD": "true"}
    with pytest.raises(ConfigError, match="DWD_DRYRUN_OLD: not a setting"):
        aggregator_settings.Settings.from_env(env)
    monkeypatch.setattr(aggregator_settings, "RENAMED", {"DWD_DRYRUN_OLD": "DWD_DRY_RUN"})
    settings = aggregator_settings.Settings.from_env(env)
    assert settings.scaling.dry_run is True
    assert settings.deprecated == (
        "DWD_DRYRUN_OLD: renamed DWD_DRY_RUN, read as DWD_DRY_RUN for this release: rename it",
    )
