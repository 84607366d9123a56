"""What a long build says while it runs: a numbered line as each step starts and as it ends, with
the time it took, and a heartbeat while it runs (a cold Go build is minutes of silence
otherwise); the tools' own output goes to a log file, and its last lines are shown if a step
fails. Standard library only: testenv/base/binaries.py runs before the venv exists."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

# Shown of a failed step's log: go prints its compile errors last.
TAIL_LINES = 25


class StepFailed(RuntimeError):
    """A step's command failed; the message carries its log's path and last lines."""


def duration(seconds: float) -> str:
    """45s, 2m30s, 1h05m: what a person reads at a glance."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """The steps of one build, numbered ``(n/total)`` in the order they start (steps may run
    side by side, in threads), each with a heartbeat every ``heartbeat_s``."""

    def __init__(
        self,
        total: int,
        out: TextIO = sys.stderr,
        *,
        heartbeat_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.out, self.heartbeat_s, self.clock = total, out, heartbeat_s, clock
        self.started = 0
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        with self.lock:
            print(f"testenv: {text}", file=self.out, flush=True)

    @contextlib.contextmanager
    def step(self, doing: str, done: str, detail: str = "") -> Iterator[None]:
        """``doing`` ("fetching Go modules for etcd v3.6.16") while the block runs, ``done``
        ("fetched ...") once it has; ``detail`` is added to the first line (where the log
        goes). A failure says how long it ran and is raised on."""
        with self.lock:
            self.started += 1
            number = f"({self.started}/{max(self.total, self.started)})"
        began = self.clock()
        self.say(f"{number} {doing} ...{detail}")
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(doing, began, stop), daemon=True)
        beat.start()
        try:
            yield
        except BaseException:
            stop.set()
            beat.join()
            self.say(f"{number} {doing}: failed after {duration(self.clock() - began)}")
            raise
        stop.set()
        beat.join()
        self.say(f"{number} {done} in {duration(self.clock() - began)}")

    def _beat(self, doing: str, began: float, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            self.say(f"still {doing}, {duration(self.clock() - began)}")


def run_logged(
    argv: Sequence[str],
    log: Path,
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdout: bool = True,
) -> None:
    """``argv`` with its output appended to ``log`` (its standard output too, unless
    ``stdout`` is false); raises StepFailed with the log's last lines if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(argv)}\n")
        f.flush()
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdout=f if stdout else subprocess.DEVNULL,
            stderr=f,
            check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-TAIL_LINES:])
        raise StepFailed(f"{argv[0]} {argv[1]} failed (exit {done.returncode}); the end of {log}:\n{tail}")
