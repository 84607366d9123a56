from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testenv.gardener import gardener_types
from testenv.kube.controlplane import ControlPlane
from testenv.worlds.agents import Agents, agents_for
from testenv.worlds.shoot_world import Shoot, shoot_for
from tests.integration.dwdworld import DwdWorld, dwd_worlds
from tests.integration.nodesworld import NodesWorld, nodes_world


@pytest.fixture
def agents(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Agents]:
    with agents_for(control_plane, tmp_path) as a:
        yield a


@pytest.fixture
def shoot(seed_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Shoot]:
    namespace = "shoot--t--" + request.node.name.lower().replace("_", "-")[5:40].strip("-")
    if hasattr(request.node, "callspec"):
        # The cases of a parametrized test share the start of their name, and the seed.
        namespace += "-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:6]
    with shoot_for(seed_plane, namespace, tmp_path) as s:
        yield s


@pytest.fixture
def world_for(shoot: Shoot) -> Iterator[Callable[..., DwdWorld]]:
    """A shoot whose kubelet leases renew, and a dependency-watchdog stand-in (not started)."""
    with dwd_worlds(shoot) as make:
        yield make


@pytest.fixture
def real_nodes(shoot: Shoot) -> Iterator[NodesWorld]:
    """Ten nodes, each a real agent and a kubelet stand-in behind one load balancer (not started)."""
    with nodes_world(shoot) as w:
        yield w


@pytest.fixture(scope="module")
def gardener_checker() -> None:
    """Gardener's types checker built (testenv/gardener/grm.py builds it beside GRM): a test module that
    needs it fails without it, never skips."""
    try:
        gardener_types.find()
    except FileNotFoundError as e:
        pytest.fail(str(e))
