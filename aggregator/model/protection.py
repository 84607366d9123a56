"""A shoot's own settings: the ``providerConfig`` of its Extension, typed, versioned, checked.

    providerConfig:
      apiVersion: dwd-lease.extensions.gardener.cloud/v1alpha1
      kind: ProtectionConfig
      dryRun: true                 # each field overrides the seed's setting of the same meaning
      failureFraction: 0.7
      recoveryFraction: 0.3
      dependents: [...]            # dependency-watchdog's dependentResourceInfos
      disabled: false              # the shoot owner's opt-out: no target, our marks handed back

The kind is ``ProtectionConfig``, not ``ProviderConfig``: every Extension's ``providerConfig`` is
a provider config, so that name says nothing; this one configures the shoot's meltdown
protection, and reads as Gardener's own extensions name theirs (``CertConfig``, ``DNSConfig``).

Each value is checked as data by the seed's own setting (``core.config.value_problem`` on the
settings field, and the rule between the fractions), so a bad one reads as a bad variable does,
named by its field: ``providerConfig.failureFraction: 1.5 is not a fraction in (0, 1]``.
Unknown fields, another apiVersion or kind, and wrong types are refused; every problem is
listed at once.

Pure: tests/unit/test_layers.py keeps the model free of I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from aggregator.model.dependents import Dependent, parse_dependents
from aggregator.model.settings import DeciderSettings, ScaleSettings, Settings, fractions_out_of_order
from core.config import Var, value_problem, variables
from core.errors import ConfigError

API_VERSION = "dwd-lease.extensions.gardener.cloud/v1alpha1"
KIND = "ProtectionConfig"
WHERE = "providerConfig"

# The fields that override a seed setting: the key, the settings group and its field.
OVERRIDES: dict[str, tuple[type, str]] = {
    "dryRun": (ScaleSettings, "dry_run"),
    "failureFraction": (DeciderSettings, "failure_fraction"),
    "recoveryFraction": (DeciderSettings, "recovery_fraction"),
}
KNOWN = frozenset({"apiVersion", "kind", "dependents", "disabled", *OVERRIDES})


@dataclass(frozen=True)
class ProtectionConfig:
    """What a shoot sets over the seed's settings (``None``: the seed's)."""

    dry_run: bool | None = None
    failure_fraction: float | None = None
    recovery_fraction: float | None = None
    dependents: tuple[Dependent, ...] | None = None
    disabled: bool = False

    def over(self, settings: Settings) -> Settings:
        """``settings`` with this shoot's values in place of the seed's."""
        decider = {
            k: v for k in ("failure_fraction", "recovery_fraction") if (v := getattr(self, k)) is not None
        }
        if not decider and self.dry_run is None:
            return settings
        scaling = (
            settings.scaling if self.dry_run is None else replace(settings.scaling, dry_run=self.dry_run)
        )
        return replace(settings, decider=replace(settings.decider, **decider), scaling=scaling)


def parse(raw: Any, settings: Settings) -> ProtectionConfig:
    """An Extension's ``providerConfig`` (None: none given, the seed's settings), checked against
    the seed's ``settings``; ConfigError lists every problem, each naming its field."""
    config, given = _checked(raw)
    _relations(config, settings, given)
    return config


def check(raw: Any) -> ProtectionConfig:
    """The rules of the shoot's own fields, the seed's settings aside (relations between fields
    the config sets itself included): what the garden's door applies at the Shoot's update
    (aggregator/model/door.py), where no seed's settings are known."""
    config, given = _checked(raw)
    _relations(config, Settings(), given, own_only=True)
    return config


def _checked(raw: Any) -> tuple[ProtectionConfig, set[str]]:
    if raw is None:
        return ProtectionConfig(), set()
    if not isinstance(raw, Mapping):
        raise ConfigError([f"{WHERE}: expected an object with apiVersion {API_VERSION} and kind {KIND}"])
    problems = _header(raw)
    values = {key: raw[key] for key in OVERRIDES if key in raw}
    fields: dict[str, Any] = {}
    for key, value in values.items():
        if (problem := value_problem(override_var(key), value)) is not None:
            problems.append(f"{WHERE}.{key}: {problem}")
        else:
            fields[OVERRIDES[key][1]] = value
    disabled = raw.get("disabled", False)
    if not isinstance(disabled, bool):
        problems.append(f"{WHERE}.disabled: {disabled!r} is not a boolean (true or false)")
    dependents = None
    if "dependents" in raw:
        try:
            dependents = parse_dependents(raw["dependents"], f"{WHERE}.dependents")
        except ConfigError as e:
            problems += e.problems
    if problems:
        raise ConfigError(problems)
    return ProtectionConfig(**fields, dependents=dependents, disabled=disabled is True), set(values)


def _header(raw: Mapping[str, Any]) -> list[str]:
    problems = []
    if raw.get("apiVersion") != API_VERSION:
        problems.append(f"{WHERE}.apiVersion: {raw.get('apiVersion')!r} is not {API_VERSION}")
    if raw.get("kind") != KIND:
        problems.append(f"{WHERE}.kind: {raw.get('kind')!r} is not {KIND}")
    problems += [f"{WHERE}.{key}: unknown field" for key in sorted(set(raw) - KNOWN, key=str)]
    return problems


def _relations(
    config: ProtectionConfig, settings: Settings, given: set[str], *, own_only: bool = False
) -> None:
    """The rule between the fractions, on the shoot's values over the seed's: a message names the
    shoot's field where the shoot set it, the seed's variable where it did not. ``own_only``:
    only where the shoot set both (a problem that names no seed variable)."""
    if own_only and not {"recoveryFraction", "failureFraction"} <= given:
        return
    recovery, failure = config.recovery_fraction, config.failure_fraction
    problem = fractions_out_of_order(
        settings.decider.recovery_fraction if recovery is None else recovery,
        settings.decider.failure_fraction if failure is None else failure,
        (_named("recoveryFraction", given), _named("failureFraction", given)),
    )
    if problem is not None:
        raise ConfigError([problem])


def _named(key: str, given: set[str]) -> str:
    """The shoot's field where it set it, else the seed's variable it stands for."""
    return f"{WHERE}.{key}" if key in given else override_var(key).name


def override_var(key: str) -> Var:
    """The seed setting that the providerConfig's field ``key`` overrides."""
    return _field(*OVERRIDES[key])[1]


def _field(group: type, name: str) -> tuple[dataclasses.Field[Any], Var]:
    return next((f, v) for f, v in variables(group) if f.name == name)
