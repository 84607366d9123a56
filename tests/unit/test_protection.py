"""A shoot's providerConfig (aggregator/model/protection.py): typed, versioned, strict, and
checked by the seed's own settings, every problem at once, each naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.model.protection import API_VERSION, KIND, ProtectionConfig, parse
from aggregator.model.settings import DeciderSettings, Settings
from core.config import EnvReader
from core.errors import ConfigError

SEED = Settings()
MCM_ONLY = [
    {
        "ref": {"kind": "Deployment", "name": "machine-controller-manager", "apiVersion": "apps/v1"},
        "scaleUp": {"level": 0, "initialDelay": "0s", "timeout": "30s"},
        "scaleDown": {"level": 0, "initialDelay": "0s", "timeout": "30s"},
    }
]


def config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, **fields}


def problems(raw: Any, settings: Settings = SEED) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse(raw, settings)
    return e.value.problems


def test_no_provider_config_is_the_seeds_settings() -> None:
    assert parse(None, SEED) == ProtectionConfig()
    assert ProtectionConfig().over(SEED) is SEED
    assert parse(config(), SEED) == ProtectionConfig()


def test_each_field_overrides_the_seeds_setting_of_its_meaning() -> None:
    got = parse(
        config(dryRun=True, failureFraction=0.8, recoveryFraction=0.5, dependents=MCM_ONLY, disabled=True),
        SEED,
    )
    assert (got.dry_run, got.failure_fraction, got.recovery_fraction, got.disabled) == (True, 0.8, 0.5, True)
    assert got.dependents is not None and [d.name for d in got.dependents] == ["machine-controller-manager"]
    settings = got.over(SEED)
    assert settings.scaling.dry_run is True
    assert (settings.decider.failure_fraction, settings.decider.recovery_fraction) == (0.8, 0.5)
    # Only what the shoot sets changes: the rest stays the seed's.
    assert settings.decider.lease_duration_s == SEED.decider.lease_duration_s
    assert parse(config(dryRun=False), SEED).over(SEED).decider == SEED.decider


def test_a_bad_value_reads_as_the_seeds_setting_would_say_it_named_by_its_field() -> None:
    """The same check as the variable's: the message after the name is the environment's."""
    env = EnvReader({"DWD_FAILURE_FRACTION": "1.5"})
    DeciderSettings.from_env(env)
    assert env.problems == ["DWD_FAILURE_FRACTION: 1.5 is not a fraction in (0, 1]"]
    assert problems(config(failureFraction=1.5)) == [
        "providerConfig.failureFraction: 1.5 is not a fraction in (0, 1]"
    ]


def test_every_problem_is_listed_at_once() -> None:
    raw = {
        "apiVersion": "dwd-lease.extensions.gardener.cloud/v1beta9",
        "kind": "ProviderConfig",
        "dryrun": True,
        "failureFraction": "0.5",
        "recoveryFraction": 0,
        "dryRun": "yes",
        "disabled": 1,
        "dependents": [{"ref": {}}],
    }
    assert problems(raw) == [
        f"providerConfig.apiVersion: 'dwd-lease.extensions.gardener.cloud/v1beta9' is not {API_VERSION}",
        f"providerConfig.kind: 'ProviderConfig' is not {KIND}",
        "providerConfig.dryrun: unknown field",
        "providerConfig.dryRun: 'yes' is not a boolean (true or false)",
        "providerConfig.failureFraction: '0.5' is not a number",
        "providerConfig.recoveryFraction: 0 is not a fraction in (0, 1]",
        "providerConfig.disabled: 1 is not a boolean (true or false)",
        "providerConfig.dependents: entry 0: ref.name is required",
    ]


def test_the_header_is_required() -> None:
    assert problems({"dryRun": True}) == [
        f"providerConfig.apiVersion: None is not {API_VERSION}",
        f"providerConfig.kind: None is not {KIND}",
    ]
    assert problems(["dryRun"]) == [
        f"providerConfig: expected an object with apiVersion {API_VERSION} and kind {KIND}"
    ]


def test_the_seeds_relations_hold_for_the_shoots_values_named_by_whoever_set_them() -> None:
    assert problems(config(failureFraction=0.5, recoveryFraction=0.7)) == [
        "providerConfig.recoveryFraction: 0.7 must not exceed providerConfig.failureFraction (0.5)"
    ]
    # The shoot lowered one side only: the other is the seed's, named as the seed's variable.
    assert problems(config(failureFraction=0.2)) == [
        f"DWD_RECOVERY_FRACTION: {SEED.decider.recovery_fraction} must not exceed "
        "providerConfig.failureFraction (0.2)"
    ]


def test_dependents_are_read_in_dependency_watchdogs_shape_as_the_file_is() -> None:
    assert problems(config(dependents=[])) == [
        "providerConfig.dependents: expected a non-empty list dependentResourceInfos"
    ]
    twice = [*MCM_ONLY, *MCM_ONLY]
    assert problems(config(dependents=twice)) == ["providerConfig.dependents: a resource is listed twice"]
    got = parse(config(dependents=MCM_ONLY), SEED).dependents
    assert got is not None and len(got) == 1
    assert (got[0].kind, got[0].name, got[0].scale_up.level, got[0].scale_up.initial_delay_s) == (
        "Deployment",
        "machine-controller-manager",
        0,
        0.0,
    )
