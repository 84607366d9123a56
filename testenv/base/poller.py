"""The harness's one background loop: a thread that calls ``step`` every ``every_s``."""

from __future__ import annotations

import threading
import time

import httpx

from core.errors import KubeError
from testenv.base.process import ahead_on_the_cpu

# What a step against a control plane that is being faulted, restarted or stopped may raise:
# counted, and the next step tries again.
TRANSIENT: tuple[type[BaseException], ...] = (KubeError, OSError, httpx.HTTPError)


class Poller(threading.Thread):
    """Calls ``step`` every ``every_s`` until stopped; a step that raises one of ``errors`` is
    counted in ``self.errors``, not fatal. ``fixed_rate``: ``every_s`` from one step's start to
    the next (for samplers whose record is read as a time series), not from its end.

    The thread runs ahead on the CPU where that is allowed (``ahead_on_the_cpu``): a poller is a
    test's eyes, and a sampler starved for 2.6 s beside four workers failed a test that had
    nothing wrong in it but the gap in its record."""

    def __init__(
        self,
        name: str,
        every_s: float,
        *,
        errors: tuple[type[BaseException], ...] = TRANSIENT,
        fixed_rate: bool = False,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.every_s = every_s
        self.halt = threading.Event()
        self.errors = 0
        self._transient = errors
        self._fixed_rate = fixed_rate

    def step(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        with ahead_on_the_cpu():
            while not self.halt.is_set():
                started = time.monotonic()
                try:
                    self.step()
                except self._transient:
                    self.errors += 1
                spent = time.monotonic() - started if self._fixed_rate else 0.0
                self.halt.wait(max(0.0, self.every_s - spent))

    def stop(self, timeout_s: float = 10.0) -> None:
        self.halt.set()
        if self.ident is not None:  # a test may drive step() without starting the thread
            self.join(timeout_s)
        self.close()

    def close(self) -> None:
        """What the poller holds (its clients), once its thread is done."""
