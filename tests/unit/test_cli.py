"""``--help`` and ``--version`` on both programs answer without reading a setting; anything
else on the command line is refused (the settings are environment variables)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CLEAN = {"PATH": "/usr/bin:/bin"}  # no DWD_ variables, no NODE_NAME: nothing to start from


def run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=CLEAN,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("module", "wanted"),
    [
        ("agent", ["DWD_RENEW_INTERVAL          2s", "NODE_NAME                   (required)"]),
        ("aggregator", ["DWD_DRY_RUN                    false", "DWD_LEASE_DURATION             6s"]),
    ],
)
def test_help_lists_every_setting_with_its_default(module: str, wanted: list[str]) -> None:
    out = run(module, "--help")
    assert out.returncode == 0, out.stderr
    for line in wanted:
        assert line in out.stdout, out.stdout


@pytest.mark.parametrize("module", ["agent", "aggregator"])
def test_version_and_a_stray_argument(module: str) -> None:
    version = run(module, "--version")
    assert version.returncode == 0 and version.stdout.startswith(f"dwd-lease-{module} "), version
    stray = run(module, "--dry-run")
    assert stray.returncode == 2 and "unknown argument '--dry-run'" in stray.stderr, stray


def test_bench_help_lists_the_benchmarks_and_runs_none() -> None:
    from bench.__main__ import BENCHMARKS, LONG, QUICK

    out = run("bench", "--help")
    assert out.returncode == 0, out.stderr
    quick, long = out.stdout.split("make bench-full")
    for name in BENCHMARKS:
        assert f"  {name} " in out.stdout
    for name in QUICK:
        assert f"  {name} " in quick and f"  {name} " not in long, out.stdout
    for name in LONG:
        assert f"  {name} " in long and f"  {name} " not in quick, out.stdout
    assert run("bench", "no-such").returncode == 2
    both = run("bench", "--full", "race")
    assert both.returncode == 2 and "--full or names, not both" in both.stderr, both


def test_make_bench_runs_the_quick_ones_and_bench_full_all() -> None:
    from bench.__main__ import BENCHMARKS, LONG, QUICK, chosen

    assert QUICK and LONG and not set(QUICK) & set(LONG)
    assert set(BENCHMARKS) == set(QUICK) | set(LONG)
    assert "agent_footprint" in QUICK and {"race", "path", "seed", "scale"} <= set(LONG)
    assert chosen([]) == list(QUICK)
    assert chosen(["--full"]) == list(QUICK) + list(LONG)
    assert chosen(["seed", "agent_footprint"]) == ["seed", "agent_footprint"]
