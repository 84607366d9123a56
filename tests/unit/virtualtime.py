"""An asyncio event loop on a virtual clock, for tests of timing rules that need no real I/O.

When nothing is ready, the loop does not sleep until its next timer: its clock jumps there.
Every timer (``asyncio.sleep``, ``asyncio.wait``'s timeout, ``call_later``) then fires at its
exact moment however loaded the machine is, and a test can assert durations to the
millisecond. A test that waits on real I/O (a socket, a thread) must not run here: the clock
would jump past it. The start is arbitrary; far from 0, as a real monotonic clock is.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

from tests.tasks import fail_on_tasks_left

EPOCH = 1000.0

P = ParamSpec("P")


class _Jumping(selectors.DefaultSelector):
    """What is ready now, at once; with nothing ready and a timer due in ``timeout``, the clock
    moves on by ``timeout`` instead of waiting for it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = EPOCH

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O (another thread's wake-up) can come
            return super().select(None)
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumping = _Jumping()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now

    def advance(self, seconds: float) -> None:
        """The clock moves on while the loop is held: a callback that took ``seconds``."""
        self._jumping.now += seconds


def now() -> float:
    """The running loop's clock: what the code under test is given as its ``clock``."""
    return asyncio.get_running_loop().time()


def in_virtual_time(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Runs an async test on a VirtualTimeLoop of its own (pytest-asyncio's loop keeps the real
    clock), with the check tests/conftest.py makes of every other test: no task left running."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(_alone(test(*args, **kwargs)))

    return run


async def _alone(body: Coroutine[Any, Any, None]) -> None:
    before = asyncio.all_tasks()
    await body
    await fail_on_tasks_left(before)
