"""One corpus of shoot providerConfigs, good and bad, for the garden's door and the aggregator's own
rules (aggregator/model/protection.py ``check``): tests/unit/test_door.py and
tests/integration/test_garden.py judge each by both."""

from __future__ import annotations

from typing import Any

from aggregator.model.protection import API_VERSION, KIND

BASE: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
STEP = {"level": 0, "initialDelay": "30s", "timeout": "1m"}


def dependent(name: str = "kube-controller-manager", **changes: Any) -> dict[str, Any]:
    return {"ref": {"name": name}, "scaleUp": dict(STEP), "scaleDown": dict(STEP, level=1), **changes}


def _with(**fields: Any) -> dict[str, Any]:
    return {**BASE, **fields}


def corpus() -> list[tuple[str, Any]]:
    """(what, providerConfig): each field over values it takes and values it refuses."""
    cases: list[tuple[str, Any]] = [("empty", dict(BASE)), ("not an object", "dryRun: true")]
    cases += [("no apiVersion", {"kind": KIND}), ("no kind", {"apiVersion": API_VERSION})]
    cases += [("another apiVersion", _with(apiVersion="dwd-lease.extensions.gardener.cloud/v1"))]
    cases += [("another kind", _with(kind="ProviderConfig"))]
    cases += [(f"unknown {k}", _with(**{k: True})) for k in ("dryrun", "failurefraction", "enabled")]
    flags: tuple[Any, ...] = (True, False, "true", 1, 0, None)
    for flag in flags:
        cases.append((f"dryRun {flag!r}", _with(dryRun=flag)))
        cases.append((f"disabled {flag!r}", _with(disabled=flag)))
    fractions: tuple[Any, ...] = (0.3, 0.5, 1, 1.0, 0, 0.0, -0.1, 1.5, 1e-9, "0.5", True, None)
    for key in ("failureFraction", "recoveryFraction"):
        for fraction in fractions:
            cases.append((f"{key} {fraction!r}", _with(**{key: fraction})))
    for failure, recovery in ((0.7, 0.3), (0.5, 0.5), (0.3, 0.7), (1, 0.99), (0.6, 1)):
        cases.append(
            (
                f"failure {failure} recovery {recovery}",
                _with(failureFraction=failure, recoveryFraction=recovery),
            )
        )
    steps: list[tuple[str, dict[str, Any]]] = [
        ("no level", {"initialDelay": "30s", "timeout": "1m"}),
        ("level 2", dict(STEP, level=2)),
        ("level -1", dict(STEP, level=-1)),
        ("level true", dict(STEP, level=True)),
        ("level 1.5", dict(STEP, level=1.5)),
        ("level '1'", dict(STEP, level="1")),
        ("delay 0", dict(STEP, initialDelay="0")),
        ("delay 1m30s", dict(STEP, initialDelay="1m30s")),
        ("delay 1.5s", dict(STEP, initialDelay="1.5s")),
        ("delay -1s", dict(STEP, initialDelay="-1s")),
        ("delay 5", dict(STEP, initialDelay="5")),
        ("delay number", dict(STEP, initialDelay=5)),
        ("delay 30 s", dict(STEP, initialDelay="30 s")),
        ("delay 1d", dict(STEP, initialDelay="1d")),
        ("timeout 0s", dict(STEP, timeout="0s")),
        ("timeout 500ms", dict(STEP, timeout="500ms")),
        ("timeout -5s", dict(STEP, timeout="-5s")),
        ("timeout abc", dict(STEP, timeout="abc")),
        ("no delay nor timeout", {"level": 1}),
    ]
    cases += [
        (f"dependents: scaleUp {what}", _with(dependents=[dependent(scaleUp=step)])) for what, step in steps
    ]
    cases += [
        ("dependents: one", _with(dependents=[dependent()])),
        ("dependents: two", _with(dependents=[dependent(), dependent("machine-controller-manager")])),
        ("dependents: twice the same", _with(dependents=[dependent(), dependent()])),
        ("dependents: empty", _with(dependents=[])),
        ("dependents: not a list", _with(dependents="kube-controller-manager")),
        ("dependents: an empty entry", _with(dependents=[{}])),
        ("dependents: no scaleDown", _with(dependents=[{"ref": {"name": "x"}, "scaleUp": dict(STEP)}])),
        (
            "dependents: a StatefulSet",
            _with(dependents=[dependent(ref={"name": "etcd", "kind": "StatefulSet"})]),
        ),
        ("dependents: a DaemonSet", _with(dependents=[dependent(ref={"name": "x", "kind": "DaemonSet"})])),
        (
            "dependents: apps/v1beta1",
            _with(dependents=[dependent(ref={"name": "x", "apiVersion": "apps/v1beta1"})]),
        ),
        ("dependents: optional", _with(dependents=[dependent(optional=True)])),
        ("dependents: optional 'yes'", _with(dependents=[dependent(optional="yes")])),
        ("dependents: name ''", _with(dependents=[dependent(ref={"name": ""})])),
        ("dependents: name 5", _with(dependents=[dependent(ref={"name": 5})])),
        ("dependents: no ref", _with(dependents=[{"scaleUp": dict(STEP), "scaleDown": dict(STEP)}])),
        (
            "everything",
            _with(
                dryRun=True,
                failureFraction=0.8,
                recoveryFraction=0.2,
                disabled=False,
                dependents=[dependent()],
            ),
        ),
    ]
    return cases
