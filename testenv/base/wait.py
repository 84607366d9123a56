"""Waiting for a condition: the one loop the harness polls with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str,
    every_s: float = 0.05,
    error: type[Exception] = AssertionError,
) -> Any:
    """``predicate``'s first truthy value within ``timeout_s``; ``error`` (a test's failure
    unless the caller is a tool that reports timeouts as such) names ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


class _TimedOut(Exception):
    """Only ``eventually``'s own: an AssertionError from the predicate still fails the test."""


def eventually(predicate: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> bool:
    """Whether ``predicate`` holds within ``timeout_s``; the caller says what it means."""
    try:
        wait_for(predicate, timeout_s, "", every_s, error=_TimedOut)
    except _TimedOut:
        return False
    return True
