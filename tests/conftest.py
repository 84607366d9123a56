from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from testenv.controlplane import ControlPlane
from testenv.process import kill_python_children

pytest_plugins = ["testenv.pytest_plugin"]


@pytest.fixture(scope="session")
def seed_plane() -> Iterator[ControlPlane]:
    """The seed: a second API server, so the shoot's can fail while the seed's keeps working."""
    with ControlPlane().running() as cp:
        yield cp


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_session() -> Iterator[None]:
    yield
    kill_python_children()


@pytest.fixture(autouse=True)
async def _no_task_left_behind() -> AsyncIterator[None]:
    """A test must not leave tasks running: they would fire into the next test (kopf checks the same)."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    for t in leftover:
        t.cancel()
    if leftover:
        await asyncio.gather(*leftover, return_exceptions=True)
        pytest.fail(f"test left tasks running: {[t.get_name() for t in leftover]}")
