"""The one way the harness starts a program: ``spawn`` gives a ``Process`` with its log.

etcd, kube-apiserver, KCM, the agents, the aggregator and ``podman run`` all start here, so
a test that fails can show any of them the same way (``tail``), and stop them the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


@contextlib.contextmanager
def ahead_on_the_cpu(nice: int = -10) -> Iterator[bool]:
    """This thread at ``nice``, and with it every thread and process it starts meanwhile (both
    inherit it); the thread's own priority back after. Yields whether it was raised: only root
    may (CI is root), elsewhere nothing changes.

    For a world whose claims are about its path's timings, not about a CPU shared with other
    worlds: under `make test` on 2 cores four workers' worlds and the image builds run beside it, and a
    starved load balancer thread reads as a broken path."""
    tid = 0  # Linux: the calling thread, not the whole process
    before = os.getpriority(os.PRIO_PROCESS, tid)
    raised = True
    try:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except PermissionError:
        raised = False
    try:
        yield raised
    finally:
        if raised:
            os.setpriority(os.PRIO_PROCESS, tid, before)


def _die_with_parent() -> None:
    # A SIGKILLed test runner must not leave an etcd or kube-apiserver behind.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Process:
    """A program started by the harness, with its log (stdout and stderr): what it did is read
    from there, as JSON lines when it logs them."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout_s: float | None = None) -> int:
        return self.popen.wait(timeout_s)

    def terminate(self, timeout_s: float = 5) -> int:
        """SIGTERM and its exit code; ``subprocess.TimeoutExpired`` if it does not exit in time."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it is still there after ``timeout_s``."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.terminate(timeout_s)
        self.kill()

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait()

    def events(self) -> list[dict[str, Any]]:
        return json_log(self.log_path)

    def names(self) -> list[str]:
        return [e["event"] for e in self.events()]

    def tail(self, lines: int = 30) -> str:
        """The end of its log, for a failure message."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
    uid: int | None = None,
) -> Process:
    """``argv`` running with its output in ``log_path`` (truncated). ``die_with_parent``: killed
    with this process, for servers no ``finally`` may get to stop. ``uid``: as that user and
    group, no other group (this process must be root)."""
    as_user: dict[str, Any] = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        popen = subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if die_with_parent else None,  # noqa: PLW1509 - prctl only
            **as_user,
        )
    return Process(name, popen, log_path)


# Every agent and aggregator started, killed when this interpreter exits: one a failed test
# lost track of would otherwise outlive the run, retrying its dead API server on a CPU the
# next tests need (no PDEATHSIG for them: the soak rig starts some from its threads, and a
# thread's exit would take them along).
_PYTHON_CHILDREN: list[Process] = []


def spawn_python(
    name: str,
    module: str,
    *,
    log_path: Path,
    env: Mapping[str, str],
    uid: int | None = None,
    source: Path | None = None,
) -> Process:
    """``python -m module`` (the agent, the aggregator) from this interpreter, with ``env``
    (``uid``: as that user, see ``spawn``). ``source``: a tree of another release's packages,
    imported before the installed ones (``-m`` puts its working directory first)."""
    argv = [sys.executable, "-m", module]
    proc = spawn(name, argv, log_path=log_path, env=env, uid=uid, cwd=source)
    _PYTHON_CHILDREN[:] = [p for p in _PYTHON_CHILDREN if p.alive()]
    _PYTHON_CHILDREN.append(proc)
    return proc


@atexit.register
def kill_python_children() -> None:
    """Kill every agent and aggregator still running (a test session's end calls it too:
    pytest-xdist's workers may exit without running atexit)."""
    for proc in _PYTHON_CHILDREN:
        if proc.alive():
            proc.kill()


def stop_all(procs: Iterable[Process], timeout_s: float = 5.0) -> None:
    """SIGTERM to every one first, so they shut down together, then ``stop`` each."""
    procs = list(procs)
    for p in procs:
        if p.alive():
            p.popen.send_signal(signal.SIGTERM)
    for p in procs:
        p.stop(timeout_s)


def json_log(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a process's log (structlog's json format); other lines are skipped."""
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out
