"""The garden's door for a shoot's ``providerConfig``: a ValidatingAdmissionPolicy on
``core.gardener.cloud`` Shoots, rendered from the rules the aggregator itself applies
(aggregator/model/protection.py ``check``), so that a typo is refused at the Shoot's update with a
message naming the field and what it allows, not answered later as a ``lastError`` that holds
the shoot's reconcile.

A policy, not a webhook (docs/install.md): gardener-apiserver runs the ValidatingAdmissionPolicy
plugin and reads the policies from the garden's kube-apiserver, so there is no server to run, to
secure or to fail closed on. Only a Shoot whose dwd-lease providerConfig is new or changed is
judged: a Shoot without our extension, or one whose config is as it was, is never refused (an
existing shoot is not held hostage by a rule newer than its config). What the door cannot
judge is the seed's: a relation to a seed's own settings (a shoot's ``failureFraction`` below
the seed's ``DWD_RECOVERY_FRACTION``) is the aggregator's to answer, as ``lastError``.

Pure: ``python -m aggregator.model.door`` prints the manifest (``make manifests`` writes it
into manifests/gardener/garden/admission-policy.yaml; tests/unit/test_door.py holds the file
to it), and tests/integration/test_garden.py holds the door and
``check`` to the same verdicts over one corpus through the real gardener-apiserver.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from aggregator.model.dependents import KIND_PATHS
from aggregator.model.protection import API_VERSION, KIND, KNOWN, OVERRIDES, WHERE, override_var

NAME = "dwd-lease-provider-config"
EXTENSION_TYPE = "dwd-lease"
AT = f"spec.extensions[type={EXTENSION_TYPE}].{WHERE}"
# Go's duration syntax as core/durations.py reads it: a signed sequence of number-unit pairs, or 0.
# (A CEL string takes no backslash here: the dot is a class.)
DURATION = "^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$"


def _configs(obj: str) -> str:
    """The dwd-lease providerConfigs of a Shoot (``object`` or ``oldObject``)."""
    return (
        f"{obj} != null && has({obj}.spec.extensions) ? {obj}.spec.extensions.filter(e, "
        f"e.type == '{EXTENSION_TYPE}' && has(e.providerConfig)).map(e, e.providerConfig) : []"
    )


def _number(field: str) -> str:
    return f"(type(c.{field}) == int || type(c.{field}) == double)"


def _override(key: str) -> tuple[str, str]:
    """The rule of one field that overrides a seed setting, by the kind of that setting."""
    var = override_var(key)
    if var.kind == "boolean":
        return f"type(c.{key}) == bool", "a boolean (true or false)"
    if var.kind == "fraction":
        return f"{_number(key)} && double(c.{key}) > 0.0 && double(c.{key}) <= 1.0", "a fraction in (0, 1]"
    raise ValueError(f"{WHERE}.{key}: no door rule for a {var.kind} setting")


def _step(d: str, key: str) -> str:
    s = f"{d}.{key}"
    return (
        f"has({s}) && type({s}) == map"
        f" && (!has({s}.level) || (type({s}.level) == int && {s}.level >= 0))"
        f" && (!has({s}.initialDelay) || (type({s}.initialDelay) == string"
        f" && {s}.initialDelay.matches('{DURATION}') && duration({s}.initialDelay) >= duration('0s')))"
        f" && (!has({s}.timeout) || (type({s}.timeout) == string"
        f" && {s}.timeout.matches('{DURATION}') && duration({s}.timeout) > duration('0s')))"
    )


def _dependent() -> str:
    kinds = " || ".join(
        f"(d.ref.?apiVersion.orValue('apps/v1') == '{api}' && d.ref.?kind.orValue('Deployment') == '{kind}')"
        for api, kind in sorted(KIND_PATHS)
    )
    return (
        "type(d) == map && has(d.ref) && type(d.ref) == map && has(d.ref.name)"
        " && type(d.ref.name) == string && d.ref.name != ''"
        f" && ({kinds})"
        " && (!has(d.optional) || type(d.optional) == bool)"
        f" && {_step('d', 'scaleUp')} && {_step('d', 'scaleDown')}"
    )


def validations() -> list[dict[str, str]]:
    """One validation per rule, each over every dwd-lease providerConfig of the Shoot."""
    known = ", ".join(f"'{k}'" for k in sorted(KNOWN))
    rules: list[tuple[str, str]] = [
        (
            f"has(c.apiVersion) && c.apiVersion == '{API_VERSION}'",
            f"apiVersion: must be {API_VERSION}",
        ),
        (f"has(c.kind) && c.kind == '{KIND}'", f"kind: must be {KIND}"),
        (f"c.all(k, k in [{known}])", f"unknown field: the fields are {', '.join(sorted(KNOWN))}"),
    ]
    for key in OVERRIDES:
        rule, allowed = _override(key)
        rules.append((f"!has(c.{key}) || ({rule})", f"{key}: must be {allowed}"))
    rules += [
        ("!has(c.disabled) || type(c.disabled) == bool", "disabled: must be a boolean (true or false)"),
        (
            "!has(c.recoveryFraction) || !has(c.failureFraction)"
            f" || !{_number('recoveryFraction')} || !{_number('failureFraction')}"
            " || double(c.recoveryFraction) <= double(c.failureFraction)",
            "recoveryFraction: must not exceed failureFraction",
        ),
        (
            "!has(c.dependents) || (type(c.dependents) == list && size(c.dependents) > 0"
            f" && c.dependents.all(d, {_dependent()})"
            " && c.dependents.map(d, d.ref.name)"
            ".all(n, c.dependents.filter(d, d.ref.name == n).size() == 1))",
            "dependents: a non-empty list of dependency-watchdog's dependentResourceInfos, each a "
            "Deployment or StatefulSet of apps/v1 by ref.name, listed once, with scaleUp and "
            "scaleDown (level >= 0, initialDelay >= 0, timeout > 0, durations such as 30s)",
        ),
    ]
    out = [
        {"expression": f"variables.configs.all(c, {rule})", "message": f"{AT}.{message}"}
        for rule, message in rules
    ]
    # The unknown field named, as the aggregator names it.
    out[2]["messageExpression"] = (
        f"'{AT}.' + variables.configs.map(c, c.filter(k, !(k in [{known}])).join(', ')).join('; ')"
        " + ': unknown field'"
    )
    return out


def policy() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding, for the garden's kube-apiserver."""
    changed = f"request.operation == 'CREATE' || ({_configs('object')}) != ({_configs('oldObject')})"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": NAME},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["core.gardener.cloud"],
                            "apiVersions": ["*"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["shoots"],
                        }
                    ]
                },
                "matchConditions": [{"name": "dwd-lease-config-new-or-changed", "expression": changed}],
                "variables": [{"name": "configs", "expression": _configs("object")}],
                "validations": validations(),
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": NAME},
            "spec": {"policyName": NAME, "validationActions": ["Deny"]},
        },
    ]


TARGET = "manifests/gardener/garden/admission-policy.yaml"
HEADER = "# Generated by `make manifests` from aggregator/model/door.py: do not edit.\n"


def manifest() -> str:
    return HEADER + yaml.safe_dump_all(policy(), sort_keys=False, allow_unicode=True, width=100)


if __name__ == "__main__":
    sys.stdout.write(manifest())
