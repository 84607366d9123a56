"""The dependent resources and the order they are scaled in, in dependency-watchdog's shape.

    dependentResourceInfos:
      - ref: {kind: Deployment, name: machine-controller-manager, apiVersion: apps/v1}
        optional: false
        scaleUp:   {level: 1, initialDelay: 30s, timeout: 30s}
        scaleDown: {level: 0, initialDelay: 0s, timeout: 30s}

Down: lower levels first, one level at a time, resources of a level in parallel.
Up: the same with the scaleUp levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from core.durations import parse_duration
from core.errors import ConfigError, unreadable

# Which API paths serve the scale subresource of each supported kind.
KIND_PATHS = {
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments/{name}",
    ("apps/v1", "StatefulSet"): "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}",
}


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class Step:
    level: int
    initial_delay_s: float
    timeout_s: float


@dataclass(frozen=True)
class Dependent:
    api_version: str
    kind: str
    name: str
    optional: bool
    scale_up: Step
    scale_down: Step

    def path(self, namespace: str) -> str:
        return KIND_PATHS[(self.api_version, self.kind)].format(ns=namespace, name=self.name)

    def across(self) -> str:
        """The collection of this kind across every namespace (``/apis/apps/v1/deployments``)."""
        prefix, rest = KIND_PATHS[(self.api_version, self.kind)].split("/namespaces/{ns}/")
        return f"{prefix}/{rest.split('/')[0]}"

    def step(self, direction: Direction) -> Step:
        return self.scale_up if direction is Direction.UP else self.scale_down


def _dep(name: str, optional: bool, up: tuple[int, float], down: tuple[int, float]) -> Dependent:
    return Dependent(
        "apps/v1", "Deployment", name, optional, Step(up[0], up[1], 30.0), Step(down[0], down[1], 30.0)
    )


# dependency-watchdog's order: down MCM and CA, then KCM; up KCM, then MCM (30 s later), then CA.
DEFAULT_DEPENDENTS: tuple[Dependent, ...] = (
    _dep("kube-controller-manager", False, up=(0, 0.0), down=(1, 0.0)),
    _dep("machine-controller-manager", False, up=(1, 30.0), down=(0, 0.0)),
    _dep("cluster-autoscaler", True, up=(2, 0.0), down=(0, 0.0)),
)


def levels(dependents: Sequence[Dependent], direction: Direction) -> list[list[Dependent]]:
    """Dependents grouped by level for ``direction``, lowest level first."""
    by_level: dict[int, list[Dependent]] = {}
    for d in dependents:
        by_level.setdefault(d.step(direction).level, []).append(d)
    return [by_level[k] for k in sorted(by_level)]


def load_dependents(path: str) -> tuple[Dependent, ...]:
    """Parse a dependents file; every problem is named with the entry it belongs to."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError([f"DWD_DEPENDENTS_FILE: {path}: {unreadable(e)}"]) from e
    items = raw.get("dependentResourceInfos") if isinstance(raw, dict) else raw
    return parse_dependents(items, f"DWD_DEPENDENTS_FILE: {path}")


def parse_dependents(items: Any, where: str) -> tuple[Dependent, ...]:
    """``dependentResourceInfos`` (a file's, or a shoot's providerConfig's); every problem is
    named with ``where`` and the entry it belongs to."""
    if not isinstance(items, list) or not items:
        raise ConfigError([f"{where}: expected a non-empty list dependentResourceInfos"])
    problems: list[str] = []
    out: list[Dependent] = []
    for i, item in enumerate(items):
        try:
            out.append(_parse_item(item))
        except (KeyError, TypeError, ValueError) as e:
            problems.append(f"{where}: entry {i}: {e}")
    names = [d.name for d in out]
    if len(set(names)) != len(names):
        problems.append(f"{where}: a resource is listed twice")
    if problems:
        raise ConfigError(problems)
    return tuple(out)


def _parse_item(item: Any) -> Dependent:
    if not isinstance(item, dict):
        raise TypeError("not a mapping")
    ref = item.get("ref")
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not ref["name"]:
        raise ValueError("ref.name is required")
    api_version, kind = ref.get("apiVersion", "apps/v1"), ref.get("kind", "Deployment")
    if (api_version, kind) not in KIND_PATHS:
        raise ValueError(f"{api_version} {kind} is not supported (Deployment or StatefulSet in apps/v1)")
    optional = item.get("optional", False)
    if not isinstance(optional, bool):
        raise TypeError("optional must be true or false")
    return Dependent(
        api_version,
        kind,
        str(ref["name"]),
        optional,
        _parse_step(item, "scaleUp"),
        _parse_step(item, "scaleDown"),
    )


def _parse_step(item: dict[str, Any], key: str) -> Step:
    raw = item.get(key)
    if not isinstance(raw, dict):
        raise ValueError(f"{key} is required")
    level = raw.get("level", 0)
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise ValueError(f"{key}.level must be a whole number >= 0")
    delay, timeout = raw.get("initialDelay", "0s"), raw.get("timeout", "30s")
    if not isinstance(delay, str) or not isinstance(timeout, str):
        raise ValueError(f"{key}: initialDelay and timeout are durations (a string: 30s, 1m)")
    delay, timeout = parse_duration(delay), parse_duration(timeout)
    if delay < 0 or timeout <= 0:
        raise ValueError(f"{key}: initialDelay must be >= 0 and timeout > 0")
    return Step(level, delay, timeout)
