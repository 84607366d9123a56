from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testenv.controlplane import ControlPlane
from tests.integration.agents import Agents, agents_for


@pytest.fixture
def agents(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Agents]:
    with agents_for(control_plane, tmp_path) as a:
        yield a
