from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from image import build
from testenv.base import binaries
from testenv.base.process import kill_python_children
from testenv.kube.controlplane import ControlPlane
from tests.tasks import fail_on_tasks_left

pytest_plugins = ["testenv.pytest_plugin"]


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> None:
    """`make test` builds gardener-resource-manager, dependency-watchdog and the images beside
    its clock-bound tests; a test marked ``builds(...)`` waits for those builds here, before
    its timeout starts (its 120 s are for the test, not for a cold build). Returns None: the
    timeout is then set as always."""
    for marker in item.iter_markers("builds"):
        for name in marker.args:
            if name == "images":
                build.wait_for_build()
            else:
                binaries.wait_for_build(name)


# The files whose cases wait longest on clocks, longest first (seconds from `--durations=0`
# in CI). A worker of `make test` takes a whole file at a time, in collection order
# (--no-loadscope-reorder); these first, the workers end close together. A stale order costs
# minutes, not correctness.
LONG_FIRST = (
    "tests/e2e/test_kcm_loop.py",  # 370: KCM's 40 s grace, three times
    "tests/e2e/test_slow_path.py",  # 310
    "tests/integration/test_decision_safety.py",  # 250
    "tests/integration/test_demo.py",  # 210: one case, both acts of the demo
    "tests/integration/test_other_writers.py",  # 200
    "tests/e2e/test_images.py",  # 180
    "tests/integration/test_kcm_loop.py",  # 170
    "tests/integration/test_agents_fail.py",  # 110
    "tests/integration/test_roll.py",  # 100: ten real kubelets, twice
    "tests/integration/test_grm.py",  # 60: gardener-resource-manager and its ManagedResource
    "tests/soak/test_faults.py",  # 70
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable


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
    await fail_on_tasks_left(before)
