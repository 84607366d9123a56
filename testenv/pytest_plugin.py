"""pytest fixtures for the real control plane: one per test session, shared by every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testenv.base import binaries
from testenv.kube.controlplane import ControlPlane
from testenv.net.names import EXTERNAL_NAMES


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    try:
        binaries.find()
    except FileNotFoundError as e:
        pytest.fail(str(e))  # never a silent skip: integration tests are part of `make test`
    with ControlPlane(extra_sans=EXTERNAL_NAMES).running() as cp:
        yield cp
