"""The collector kept off the long-lived heap: frozen once the targets are still, thawed and
collected again when they change, so a removed target's cycles are still found."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from aggregator.ops.heap import Heap
from tests.unit.world import Clock


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()


class Node:
    """A stand-in for what a target holds: objects that point at each other."""

    def __init__(self) -> None:
        self.peer: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    return a, weakref.ref(b)


def test_frozen_only_once_the_targets_are_still_then_at_each_change_and_now_and_then() -> None:
    clock = Clock()
    heap = Heap(settle_s=30, every_s=600, clock=clock)
    assert not heap.due()  # just started: the targets' first LISTs are still arriving
    clock.now += 30
    assert heap.due()
    heap.refreeze()
    assert not heap.due()
    clock.now += 100
    heap.changed()  # a Cluster came or went
    clock.now += 29
    assert not heap.due()
    clock.now += 1
    assert heap.due()
    heap.refreeze()
    clock.now += 599
    assert not heap.due()
    clock.now += 1
    assert heap.due()


def test_what_is_frozen_is_not_scanned_and_a_thaw_finds_its_garbage() -> None:
    held, probe = cycle()
    Heap().refreeze()
    assert gc.get_freeze_count() > 0
    scanned = {id(o) for o in gc.get_objects()}
    assert id(held) not in scanned and id(probe()) not in scanned
    del held  # a target removed: its cycle is garbage, but frozen
    gc.collect()
    assert probe() is not None  # a full pass does not look at it
    Heap().refreeze()  # the thaw after a change of the targets
    assert probe() is None


async def test_the_running_heap_freezes_when_due_and_leaves_the_collector_thawed() -> None:
    clock = Clock()
    heap = Heap(settle_s=0, check_s=0.001, clock=clock)
    task = asyncio.create_task(heap.run())
    for _ in range(100):
        await asyncio.sleep(0.001)
        if heap.frozen_at is not None:
            break
    assert heap.frozen_at is not None and gc.get_freeze_count() > 0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert gc.get_freeze_count() == 0
