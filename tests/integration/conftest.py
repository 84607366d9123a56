from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testenv.controlplane import ControlPlane
from tests.integration.agents import Agents, agents_for
from tests.integration.dwdworld import DwdWorld, dwd_worlds
from tests.integration.shoot import Shoot, shoot_for


@pytest.fixture
def agents(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Agents]:
    with agents_for(control_plane, tmp_path) as a:
        yield a


@pytest.fixture
def shoot(seed_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Shoot]:
    namespace = "shoot--t--" + request.node.name.lower().replace("_", "-")[5:40].strip("-")
    with shoot_for(seed_plane, namespace, tmp_path) as s:
        yield s


@pytest.fixture
def world_for(shoot: Shoot) -> Iterator[Callable[..., DwdWorld]]:
    """A shoot whose kubelet leases renew, and a dependency-watchdog stand-in (not started)."""
    with dwd_worlds(shoot) as make:
        yield make
