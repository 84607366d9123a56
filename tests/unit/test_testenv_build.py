"""``python -m testenv build --demo`` builds only what ``make demo`` runs; without it, everything."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from testenv import __main__ as cli
from testenv.base import binaries
from testenv.gardener import dependency_watchdog, grm
from tests import conftest
from tests.unit.test_layers import third_party_reached


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["build", "--demo"], {"kube-apiserver", "kube-controller-manager", "kubemark", "etcd"}),
        (
            ["build"],
            {c.name for c in binaries.COMPONENTS} | {"gardener-resource-manager", "dependency-watchdog"},
        ),
        (["build", "--part", "first"], {c.name for c in binaries.COMPONENTS}),
        (["build", "--part", "rest"], {"gardener-resource-manager", "dependency-watchdog"}),
    ],
)
def test_build_asks_for_what_it_is_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str], wanted: set[str]
) -> None:
    monkeypatch.setenv("DWDDEV_TESTENV_CACHE", str(tmp_path))  # nothing built yet
    asked: list[str] = []

    def build(*, force: bool, only: tuple[binaries.Component, ...], **_: object) -> dict[str, Path]:
        asked.extend(c.name for c in only)
        return {}

    monkeypatch.setattr(binaries, "build", build)
    monkeypatch.setattr(grm, "build", lambda *, force: asked.append("gardener-resource-manager"))
    monkeypatch.setattr(dependency_watchdog, "build", lambda *, force: asked.append("dependency-watchdog"))
    assert cli.main(argv) == 0
    assert sorted(asked) == sorted(wanted)


def test_make_demo_builds_its_binaries_with_the_standard_library_alone(tmp_path: Path) -> None:
    """``make demo`` builds while pip installs: ``python3 -m testenv.base.binaries`` runs before the
    venv exists. Run here without site-packages (-S) against a cache that holds the demo's
    binaries (and nothing else), it must find nothing to build and exit 0."""
    env = {**os.environ, "DWDDEV_TESTENV_CACHE": str(tmp_path)}
    for component in binaries.DEMO:
        path = tmp_path / binaries.binary_path(component).relative_to(binaries.cache_root())
        path.parent.mkdir(parents=True)
        path.touch()
    out = subprocess.run(
        [sys.executable, "-S", "-m", "testenv.base.binaries"],
        cwd=Path(binaries.__file__).parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "building" not in out.stderr


HOLD_AND_INSTALL = """
import sys, time
from pathlib import Path
from testenv.base import binaries
with binaries.building("etcd"):
    print("holding", flush=True)
    time.sleep(1.0)
    path = binaries.binary_path(binaries.ETCD)
    path.parent.mkdir(parents=True)
    path.touch()
"""


def test_a_binary_being_built_is_waited_for_not_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make test` starts its clock-bound tests while some builds go on beside them: a test
    that needs one of those finds it once its build ends, instead of failing at once."""
    monkeypatch.setenv("DWDDEV_TESTENV_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="run `make testenv`"):
        binaries.find((binaries.ETCD,))  # no build under way: missing, said at once
    builder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_INSTALL],
        cwd=Path(binaries.__file__).parents[2],
        env={**os.environ, "DWDDEV_TESTENV_CACHE": str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert builder.stdout is not None and builder.stdout.readline() == "holding\n"
        started = time.monotonic()
        found = binaries.find((binaries.ETCD,))
        assert found["etcd"].exists() and time.monotonic() - started > 0.5
    finally:
        builder.communicate(timeout=10)


REST = {
    "from testenv.gardener import grm": "grm.NAME",
    "gardener_types": "grm.NAME",
    "module_crds(": "grm.NAME",
    "from testenv.gardener.dependency_watchdog import DependencyWatchdog": "dependency_watchdog.NAME",
    "containers.images(": '"images"',
}


def test_every_test_module_that_needs_a_build_made_beside_it_says_so() -> None:
    """Without the ``builds`` marker a cold `make test` fails such a module's tests on their
    timeout while the build goes on (CI, 2026-12-05: the three GRM cases after 120 s)."""
    root = Path(__file__).resolve().parents[1]
    missing = []
    for module in sorted([*root.glob("integration/test_*.py"), *root.glob("e2e/test_*.py")]):
        text = module.read_text()
        for use, name in REST.items():
            if use in text and f"pytest.mark.builds({name})" not in text:
                missing.append((module.name, name))
    assert missing == []


def test_a_marked_test_waits_for_its_build_before_its_timeout_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DWDDEV_TESTENV_CACHE", str(tmp_path))
    builder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_INSTALL.replace('"etcd"', '"gardener-resource-manager"')],
        cwd=Path(binaries.__file__).parents[2],
        env={**os.environ, "DWDDEV_TESTENV_CACHE": str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
    )

    class Item:
        def iter_markers(self, name: str) -> list[pytest.Mark]:
            return [pytest.mark.builds("gardener-resource-manager").mark] if name == "builds" else []

    try:
        assert builder.stdout is not None and builder.stdout.readline() == "holding\n"
        started = time.monotonic()
        assert conftest.pytest_timeout_set_timer(Item(), None) is None  # type: ignore[arg-type]  # its markers only
        assert time.monotonic() - started > 0.5
    finally:
        builder.communicate(timeout=10)


# The import name of each distribution the demo extra brings, where it differs.
IMPORT_NAMES = {"pyyaml": "yaml"}
ROOT = Path(__file__).resolve().parents[2]


def test_make_demo_runs_on_the_demo_extra_alone() -> None:
    """``make demo`` installs the demo extra, not the test runner or the linters: nothing the
    demo, the aggregator or the agents it starts import may come from outside it."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    wanted = [*meta["dependencies"], *extras["aggregator"], *extras["demo"], "h2"]  # httpx[http2]: h2
    names = {re.split(r"[\[<>=;! ]", spec, maxsplit=1)[0].lower() for spec in wanted}
    provided = {IMPORT_NAMES.get(n, n.replace("-", "_")) for n in names}
    reached = third_party_reached("demo.__main__", "aggregator.__main__", "agent.__main__")
    assert {"aiohttp", "httpx", "kubernetes", "yaml"} <= reached  # the walk reaches them at all
    assert reached - provided == set()


def test_make_demo_builds_quick_binaries_and_the_tests_prefer_the_optimized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold ``make demo`` compiles without the optimizations (270 s against 369 s here), in a
    cache of its own; ``find`` takes them only where the tests' optimized ones are not built,
    and ``make demo`` builds nothing where those are."""
    monkeypatch.setenv("DWDDEV_TESTENV_CACHE", str(tmp_path))
    commands: list[list[str]] = []

    def go_build(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if argv[:2] == ["go", "env"]:
            return subprocess.CompletedProcess(argv, 0, stdout="go1.25.5\n")
        if argv[:2] == ["go", "list"]:  # the modules fetched, a step before the build
            return subprocess.CompletedProcess(argv, 0)
        commands.append(argv)
        out = Path(argv[argv.index("-o") + 1])
        for package in argv[argv.index("-o") + 2 :]:
            (out / binaries._go_binary_name(package)).write_text(package)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", go_build)
    binaries.build_demo()
    assert len(commands) == 2 and all("-gcflags=all=-N -l -dwarf=false" in argv for argv in commands)
    found = binaries.find(binaries.DEMO)
    assert all(path.parent.name.endswith("-quick") for path in found.values()), found

    binaries.build(only=(binaries.ETCD,))
    assert "-gcflags=all=-dwarf=false" in commands[-1]
    assert binaries.find((binaries.ETCD,))["etcd"] == binaries.binary_path(binaries.ETCD)
    assert binaries.find((binaries.KUBEMARK,))["kubemark"].parent.name.endswith("-quick")

    for component in binaries.KUBERNETES:
        binaries.build(only=(component,))
    built = len(commands)
    binaries.build_demo()
    assert len(commands) == built, "make demo rebuilt what the tests had built"
