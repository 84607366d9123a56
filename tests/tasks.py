"""The check every async test ends with, on pytest-asyncio's loop (tests/conftest.py) and on the
virtual-time one (tests/unit/virtualtime.py): no task it started is left running, since it would
fire into the next test (kopf checks the same)."""

from __future__ import annotations

import asyncio

import pytest


async def fail_on_tasks_left(before: set[asyncio.Task[object]]) -> None:
    """Every task started since ``before`` and still running cancelled, and the test failed
    naming them."""
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    for t in leftover:
        t.cancel()
    if leftover:
        await asyncio.gather(*leftover, return_exceptions=True)
        pytest.fail(f"test left tasks running: {[t.get_name() for t in leftover]}")
