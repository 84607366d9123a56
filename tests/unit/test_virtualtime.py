"""tests/unit/virtualtime.py: timers fire at their exact virtual moments, in no real time."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.unit.virtualtime import EPOCH, VirtualTimeLoop, in_virtual_time, now


@in_virtual_time
async def test_an_hour_of_timers_takes_an_hour_of_the_clock_and_no_real_time() -> None:
    started, real = now(), time.monotonic()
    fired: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    loop.call_later(0.25, lambda: fired.append(("later", now() - started)))
    done, pending = await asyncio.wait([asyncio.create_task(asyncio.sleep(3600))], timeout=0.5)
    fired.append(("timeout", now() - started))
    assert not done and len(pending) == 1
    await asyncio.gather(*pending)
    fired.append(("slept", now() - started))
    assert fired == [("later", 0.25), ("timeout", 0.5), ("slept", 3600.0)]
    assert time.monotonic() - real < 1.0  # none of it waited for


@in_virtual_time
async def test_a_held_loop_is_a_jump_of_the_clock() -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop) and now() == EPOCH
    woke = asyncio.Event()
    loop.call_later(0.1, woke.set)
    loop.advance(0.3)  # a callback that held the loop for 0.3 s: the timer fires late, at once
    await woke.wait()
    assert now() == EPOCH + 0.3


def test_a_task_left_running_fails_the_test() -> None:
    @in_virtual_time
    async def leaves_one() -> None:
        asyncio.get_running_loop().create_task(asyncio.Event().wait(), name="forgotten")

    with pytest.raises(pytest.fail.Exception, match="forgotten"):
        leaves_one()
