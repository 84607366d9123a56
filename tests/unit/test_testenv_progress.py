"""What a cold build says (testenv/base/progress.py, testenv/base/binaries.py): a numbered line as each step
starts and ends, a heartbeat while it runs, go's output in a log whose end is shown on a failure.
Fake steps and a fake go: no real build."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import pytest

from testenv.base import binaries, progress
from testenv.base.progress import Progress, StepFailed


class Lines(io.StringIO):
    """Captured output that lets a test wait for a line."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()

    def write(self, s: str) -> int:
        with self.changed:
            n = super().write(s)
            self.changed.notify_all()
        return n

    def wait_for(self, text: str) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: text in self.getvalue(), timeout=10)


@pytest.mark.parametrize(
    ("seconds", "said"), [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (150, "2m30s"), (3725, "1h02m")]
)
def test_a_duration_reads_at_a_glance(seconds: float, said: str) -> None:
    assert progress.duration(seconds) == said


def test_a_step_says_when_it_starts_while_it_runs_and_when_it_ends() -> None:
    out, now = Lines(), [0.0]
    steps = Progress(2, out, heartbeat_s=0.02, clock=lambda: now[0])
    with steps.step(
        "fetching Go modules for etcd v3.6.16", "fetched Go modules for etcd v3.6.16", " (log: x)"
    ):
        now[0] = 150.0  # the step runs two and a half minutes
        assert out.wait_for("2m30s")
        now[0] = 200.0
    lines = out.getvalue().splitlines()
    assert lines[0] == "testenv: (1/2) fetching Go modules for etcd v3.6.16 ... (log: x)"
    assert "testenv: still fetching Go modules for etcd v3.6.16, 2m30s" in lines[1:-1]
    assert all(line.startswith("testenv: still fetching") for line in lines[1:-1])
    assert lines[-1] == "testenv: (1/2) fetched Go modules for etcd v3.6.16 in 3m20s"


def test_steps_side_by_side_are_numbered_as_they_start_and_a_failure_says_so() -> None:
    out = Lines()
    steps = Progress(2, out, heartbeat_s=60)
    first_started = threading.Event()

    def first() -> None:
        with steps.step("building etcd", "built etcd"):
            first_started.set()
            assert out.wait_for("(2/2) building kubemark ...")

    side = threading.Thread(target=first)
    side.start()
    assert first_started.wait(10)
    with pytest.raises(RuntimeError, match="boom"), steps.step("building kubemark", "built kubemark"):
        raise RuntimeError("boom")
    side.join(10)
    lines = out.getvalue().splitlines()
    assert lines[0] == "testenv: (1/2) building etcd ..."
    assert "testenv: (2/2) building kubemark: failed after 0s" in lines
    assert "testenv: (1/2) built etcd in 0s" in lines
    assert not any("built kubemark" in line for line in lines)


FAILING = """
import sys
for i in range(40):
    print(f"go: downloading m{i}", file=sys.stderr)
print("listed")
sys.exit(3)
"""


def test_a_failed_command_shows_the_end_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "etcd.log"
    with pytest.raises(StepFailed) as failed:
        progress.run_logged([sys.executable, "-c", FAILING], log, cwd=tmp_path, env={}, stdout=False)
    message = str(failed.value)
    assert f"(exit 3); the end of {log}:" in message
    assert "go: downloading m39" in message and "go: downloading m14" not in message  # its last lines
    assert "listed" not in log.read_text().splitlines()  # stdout=False: the package list is not kept
    assert sum(line.startswith("go: downloading") for line in log.read_text().splitlines()) == 40


def fake_go(log_lines: dict[str, str], fail: str = "") -> Any:
    """``subprocess.run`` as go would answer it: each command writes its lines to the log (the
    stderr it is given) and ``go build`` its binaries; the command named ``fail`` fails."""

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if argv[:2] == ["go", "env"]:
            return subprocess.CompletedProcess(argv, 0, stdout="go1.25.5\n")
        stderr: IO[str] = kw["stderr"]
        stderr.write(log_lines.get(argv[1], ""))
        if argv[1] == fail:
            return subprocess.CompletedProcess(argv, 1)
        if argv[1] == "build":
            out = Path(argv[argv.index("-o") + 1])
            for package in argv[argv.index("-o") + 2 :]:
                (out / binaries._go_binary_name(package)).write_text(package)
        return subprocess.CompletedProcess(argv, 0)

    return run


def test_a_cold_make_demo_says_each_step_and_keeps_go_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DWDDEV_TESTENV_CACHE", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", fake_go({"list": "go: downloading k8s.io/api v0.35.4\n"}))
    out = io.StringIO()
    binaries.build_demo(log=out)
    # The two builds run side by side: their steps are numbered in the order they started.
    said = [
        re.sub(r"^testenv: \(\d/4\) (.*) in \d+s$", r"\1 in Ns", line) for line in out.getvalue().splitlines()
    ]
    said = [re.sub(r"^testenv: \(\d/4\) ", "", line) for line in said]
    numbers = sorted(re.findall(r"^testenv: \((\d)/4\) .* \.\.\.", out.getvalue(), re.M))
    assert numbers == ["1", "2", "3", "4"]
    logs = tmp_path / "logs"
    k8s_log, etcd_log = logs / "kube-apiserver-quick.log", logs / "etcd-quick.log"
    kubernetes = "kube-apiserver, kube-controller-manager and kubemark v1.35.4 (unoptimized)"
    assert sorted(said) == sorted(
        [
            f"fetching Go modules for kubernetes v1.35.4 ... (go's output: {k8s_log})",
            "fetched Go modules for kubernetes v1.35.4 in Ns",
            f"building {kubernetes} ...",
            f"built {kubernetes} in Ns",
            f"fetching Go modules for etcd v3.6.16 ... (go's output: {etcd_log})",
            "fetched Go modules for etcd v3.6.16 in Ns",
            "building etcd v3.6.16 (unoptimized) ...",
            "built etcd v3.6.16 (unoptimized) in Ns",
        ]
    )
    assert "go: downloading k8s.io/api v0.35.4" in k8s_log.read_text()


def test_a_failed_go_build_shows_the_end_of_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DWDDEV_TESTENV_CACHE", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", fake_go({"build": "server.go:1: undefined: x\n"}, fail="build"))
    with pytest.raises(
        StepFailed, match=r"(?s)go build failed \(exit 1\); the end of .*etcd\.log:\n.*undefined: x"
    ):
        binaries.build(only=(binaries.ETCD,), log=io.StringIO())
    assert not binaries.binary_path(binaries.ETCD).exists()
