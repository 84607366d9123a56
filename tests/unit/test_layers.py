"""Who may import whom, checked on the source: ruff's banned-api applies to every file alike,
so the layers are told apart here.

- core/ and agent/ stay lean: no aggregator, aiohttp or kubernetes (the agent's image has none);
- the programs (core/, agent/, aggregator/, image/) never import the harness, the benches, the
  demo or the tests;
- testenv/ is the one harness: bench/, demo/ and testenv/ itself never import tests/; testenv/
  imports no program (it starts them as processes), no bench and no demo; the demo no bench;
- outside tests/, nothing imports pytest but the plugin tests/conftest.py registers
  (testenv/pytest_plugin.py), and nothing imports that plugin;
- inside aggregator/, each wing imports only the wings its row of ``WINGS`` names (and its
  package docstring says the same), no wing imports the composition root, the pure wings reach
  no I/O, and no module of aggregator/ or core/ is in an import cycle;
- inside testenv/, the rooms the same way by ``ROOMS`` (testenv/*.py the composition root), and
  no module of testenv/ is in an import cycle.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GO_CACHE = ROOT / "testenv" / "go"  # the Go module cache testenv builds from: not ours

# Package (a top-level directory) -> the top-level modules it must not import.
FORBIDDEN: dict[str, frozenset[str]] = {
    "core": frozenset({"aggregator", "aiohttp", "kubernetes", "testenv", "bench", "demo", "tests"}),
    "agent": frozenset({"aggregator", "aiohttp", "kubernetes", "testenv", "bench", "demo", "tests"}),
    "aggregator": frozenset({"testenv", "bench", "demo", "tests"}),
    "image": frozenset({"testenv", "bench", "demo", "tests"}),
    # Like dependency-watchdog's internal/test (.import-restrictions): the harness imports only
    # what the programs share (core/, and image/ to build them), never a program it starts nor
    # those who use it.
    "testenv": frozenset({"tests", "bench", "demo", "aggregator", "agent"}),
    "bench": frozenset({"tests"}),
    "demo": frozenset({"tests", "bench"}),
}


def imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every absolute import, nested ones (in a function) too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module.split(".")[0]


def violations(package: str, source: str, where: str) -> list[str]:
    """``where:line: package imports module`` for each forbidden import in ``source``."""
    banned = FORBIDDEN[package]
    tree = ast.parse(source, where)
    return [
        f"{where}:{line}: {package}/ imports {mod}" for line, mod in sorted(imported(tree)) if mod in banned
    ]


def test_the_layers_hold() -> None:
    found = []
    for package in FORBIDDEN:
        files = sorted((ROOT / package).rglob("*.py"))
        assert files, f"no sources under {package}/: the check would pass vacuously"
        for path in files:
            if path.is_relative_to(GO_CACHE):
                continue
            found += violations(package, path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "imports across the layers:\n" + "\n".join(found)


def test_a_forbidden_import_is_reported_with_its_line() -> None:
    source = "import os\n\n\ndef f():\n    from tests.integration import x\n\n\nimport tests\n"
    assert violations("bench", source, "bench/x.py") == [
        "bench/x.py:5: bench/ imports tests",
        "bench/x.py:8: bench/ imports tests",
    ]
    assert violations("agent", "import kubernetes.client\n", "agent/x.py") == [
        "agent/x.py:1: agent/ imports kubernetes"
    ]
    assert violations("aggregator", "from testenv.base.wait import wait_for\n", "aggregator/x.py") == [
        "aggregator/x.py:1: aggregator/ imports testenv"
    ]


def test_allowed_imports_are_not_reported() -> None:
    source = "from testenv.worlds.shoot_world import Shoot\nfrom . import tests\nimport testsuite\n"
    assert violations("bench", source, "bench/x.py") == []
    assert violations("aggregator", "import aiohttp\nfrom core.lease import X\n", "aggregator/x.py") == []


# pytest belongs to the tests: outside tests/, only the plugin they register imports it (a
# constant a world needs lives in the world's room, not in the plugin).
PYTEST_PLUGIN = "testenv.pytest_plugin"
PYTEST = ("pytest", "_pytest", PYTEST_PLUGIN)


def pytest_imports(module: str, source: str) -> list[str]:
    """``module:line: imports what`` for each import of pytest, or of the plugin that imports it."""
    return [
        f"{module}:{line}: imports {imported}"
        for line, imported in imported_modules(ast.parse(source))
        if imported.split(".")[0] in PYTEST[:2] or imported == PYTEST_PLUGIN
    ]


def test_nothing_outside_the_tests_imports_pytest() -> None:
    found = []
    for package in FORBIDDEN:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if path.is_relative_to(GO_CACHE) or module == PYTEST_PLUGIN:
                continue
            found += pytest_imports(module, path.read_text())
    assert not found, "pytest imported outside the tests:\n" + "\n".join(found)


def test_an_import_of_pytest_or_its_plugin_is_reported() -> None:
    source = "import os\nfrom testenv.pytest_plugin import control_plane\n\n\ndef f():\n    import pytest\n"
    assert pytest_imports("bench.x", source) == [
        "bench.x:2: imports testenv.pytest_plugin",
        "bench.x:6: imports pytest",
    ]
    assert pytest_imports("demo.x", "from testenv import pytest_plugin\n") == [
        "demo.x:1: imports testenv.pytest_plugin"
    ]


# -- inside aggregator/: the wings

# Wing -> the wings it may import (core/ is open to all, as are the standard library and the
# aggregator's own third-party packages). aggregator/*.py is the composition root: it may import
# any wing, and no wing imports it. docs/design.md, "The tree", gives the reason for each row.
WINGS: dict[str, frozenset[str]] = {
    "model": frozenset(),
    "kube": frozenset(),
    "decide": frozenset({"model"}),
    "lead": frozenset({"model", "kube"}),
    "ops": frozenset({"model"}),
    "observe": frozenset({"model", "kube", "ops"}),
    "act": frozenset({"model", "kube", "decide", "observe", "lead", "ops"}),
    "extension": frozenset({"model", "kube", "observe", "lead", "act"}),
}
ROOT_WING = "root"

# -- inside testenv/: the rooms, the same way. testenv/*.py (the command line, the pytest plugin)
# is the composition root. docs/harness.md, "The rooms", gives the reason for each row.
ROOMS: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "kube": frozenset({"base"}),
    "net": frozenset({"base", "kube"}),
    "gardener": frozenset({"base", "kube"}),
    "worlds": frozenset({"base", "kube", "net", "gardener"}),
}
# Package -> the table of its parts, and what every part may import besides the rows (the
# layers above allow no more).
TABLES: dict[str, dict[str, frozenset[str]]] = {"aggregator": WINGS, "testenv": ROOMS}
OPEN_TO_ALL: dict[str, frozenset[str]] = {
    "aggregator": frozenset({"core"}),
    "testenv": frozenset({"core", "image"}),
}


def part_of(module: str) -> str | None:
    """The wing or room of a module of aggregator/ or testenv/ (``root`` for the package's own
    modules); None outside both."""
    top, *rest = module.split(".")
    if top not in TABLES:
        return None
    return rest[0] if rest and rest[0] in TABLES[top] else ROOT_WING


def wing_of(module: str) -> str | None:
    """The wing of a module of aggregator/; None outside it."""
    return part_of(module) if module.partition(".")[0] == "aggregator" else None


def modules_of(package: str) -> list[str]:
    return sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / package).rglob("*.py")
        if not p.is_relative_to(GO_CACHE)
    )


def aggregator_modules() -> list[str]:
    return modules_of("aggregator")


def crossings(module: str, source: str) -> list[str]:
    """``module:line: part imports part (what)`` for each import its package's table does not
    allow (once for ``from x import a, b``)."""
    package, part = module.partition(".")[0], part_of(module)
    assert part is not None, module
    found = []
    for line, imported in imported_modules(ast.parse(source)):
        other = part_of(imported)
        if other is None or imported.partition(".")[0] != package or part in (other, ROOT_WING):
            continue
        if other == ROOT_WING or other not in TABLES[package][part]:
            found.append(f"{module}:{line}: {part} imports {other} ({imported})")
    return list(dict.fromkeys(found))


def test_every_wing_imports_only_what_its_row_allows() -> None:
    modules = aggregator_modules()
    assert {wing_of(m) for m in modules} == {*WINGS, ROOT_WING}, "a wing of the table has no module"
    found = [c for m in modules for c in crossings(m, module_source(m))]
    assert not found, "imports across the wings:\n" + "\n".join(found)


def test_every_room_imports_only_what_its_row_allows() -> None:
    modules = modules_of("testenv")
    assert {part_of(m) for m in modules} == {*ROOMS, ROOT_WING}, "a room of the table has no module"
    found = [c for m in modules for c in crossings(m, module_source(m))]
    assert not found, "imports across the rooms:\n" + "\n".join(found)


def test_the_tables_run_one_way() -> None:
    """Each row names only rows above it: no two wings or rooms import each other, however
    indirectly."""
    for package, table in TABLES.items():
        for i, (part, allowed) in enumerate(table.items()):
            assert allowed <= set(list(table)[:i]), (package, part, allowed - set(list(table)[:i]))


def test_a_planted_crossing_is_reported_in_any_room() -> None:
    """Planted in three rooms: the KAPI client reaching the control plane, the control plane
    reaching a world, the network reaching Gardener; the composition root is out of every
    room's reach."""
    kapi = "testenv.base.kapi"
    planted = module_source(kapi) + "\nfrom testenv.kube.controlplane import ControlPlane, free_port\n"
    assert crossings(kapi, planted) == [
        f"{kapi}:{planted.count(chr(10))}: base imports kube (testenv.kube.controlplane)"
    ]
    controlplane = "testenv.kube.controlplane"
    planted = module_source(controlplane) + "\n\ndef f():\n    from testenv.worlds import chain\n"
    assert crossings(controlplane, planted) == [
        f"{controlplane}:{planted.count(chr(10))}: kube imports worlds (testenv.worlds.chain)"
    ]
    dns = "testenv.net.dns"
    planted = module_source(dns) + "\nimport testenv.gardener.grm\nfrom testenv import pytest_plugin\n"
    assert crossings(dns, planted) == [
        f"{dns}:{planted.count(chr(10)) - 1}: net imports gardener (testenv.gardener.grm)",
        f"{dns}:{planted.count(chr(10))}: net imports root (testenv.pytest_plugin)",
    ]


def test_a_planted_crossing_is_reported_in_any_wing() -> None:
    """Planted in two wings: the pure decision reaching a reader, the API client reaching
    the model; the composition root is out of every wing's reach."""
    decider = "aggregator.decide.decider"
    planted = module_source(decider) + "\nfrom aggregator.observe.watcher import Informer\n"
    assert crossings(decider, planted) == [
        f"{decider}:{planted.count(chr(10))}: decide imports observe (aggregator.observe.watcher)"
    ]
    client = "aggregator.kube.client"
    planted = (
        module_source(client) + "\nif TYPE_CHECKING:\n    from aggregator.model.objects import metadata\n"
    )
    assert crossings(client, planted) == [
        f"{client}:{planted.count(chr(10))}: kube imports model (aggregator.model.objects)"
    ]
    scaler = "aggregator.act.scaler"
    planted = module_source(scaler) + "\nfrom aggregator import target\n"
    assert crossings(scaler, planted)[-1].endswith("act imports root (aggregator.target)")


def test_each_wing_and_room_says_what_it_may_import_as_the_table_does() -> None:
    for package, table in TABLES.items():
        for part, allowed in table.items():
            doc = ast.get_docstring(ast.parse(module_source(f"{package}.{part}"))) or ""
            said = re.search(r"^May import: (.*)\.$", doc, re.M)
            assert said, f"{package}/{part}/__init__.py does not say what it may import"
            assert set(said.group(1).split(", ")) == {*OPEN_TO_ALL[package], *allowed}, (part, said.group(1))


# The pure rules: the model, the decision, and the write budget's arithmetic. Tested without a
# loop, a client or a clock of their own.
PURE = (
    *(m for m in aggregator_modules() if wing_of(m) in ("model", "decide")),
    "aggregator.act.budget",
)
# What does I/O, directly or by what it starts: none of it may be reached from a pure rule.
IO = frozenset(
    {
        "asyncio",
        "aiohttp",
        "kubernetes",
        "httpx",
        "socket",
        "ssl",
        "selectors",
        "subprocess",
        "threading",
        "uvloop",
    }
)


def module_source(name: str) -> str:
    path = ROOT / (name.replace(".", "/") + ".py")
    return (path if path.exists() else ROOT / name.replace(".", "/") / "__init__.py").read_text()


def io_reached(start: str, source_of: Callable[[str], str] = module_source) -> list[str]:
    """``a -> b -> asyncio``: each path from ``start`` through our own modules to one that does I/O
    (TYPE_CHECKING imports count too: a rule that names the client is not free of it)."""
    found: list[str] = []
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(start, (start,))]
    while todo:
        name, path = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for _, module in imported_modules(ast.parse(source_of(name))):
            if module.split(".")[0] in IO:
                found.append(" -> ".join((*path, module)))
            elif module.split(".")[0] in ("aggregator", "core"):
                todo.append((module, (*path, module)))
    return sorted(found)


OURS = ("aggregator", "agent", "core", "testenv", "demo", "bench", "image", "tests")


def third_party_reached(*starts: str, source_of: Callable[[str], str] = module_source) -> set[str]:
    """The top-level modules, neither ours nor the standard library's, that ``starts`` import
    directly or through our own modules (what a venv must hold to run them)."""
    found: set[str] = set()
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for _, module in imported_modules(ast.parse(source_of(name))):
            top = module.split(".")[0]
            if top in OURS:
                todo.append(module)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.add(top)
    return found


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, dotted module) of every absolute import; ``from aggregator import budget`` is
    aggregator.act.budget (a module of ours), not the package it came through."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            package = ROOT / node.module.replace(".", "/")
            for alias in node.names:
                is_module = (package / f"{alias.name}.py").exists()
                yield node.lineno, f"{node.module}.{alias.name}" if is_module else node.module


def test_the_pure_rules_reach_no_io() -> None:
    found = [p for m in PURE for p in io_reached(m)]
    assert not found, "a pure rule reaches I/O:\n" + "\n".join(found)


def test_a_planted_import_in_a_pure_rule_is_reported_with_its_path() -> None:
    planted = {"aggregator.decide.decider": module_source("aggregator.decide.decider") + "\nimport asyncio\n"}
    assert io_reached("aggregator.decide.decider", lambda n: planted.get(n) or module_source(n)) == [
        "aggregator.decide.decider -> asyncio"
    ]
    # Reached through a module the rule imports: the kube client.
    via = {
        "aggregator.decide.witness": module_source("aggregator.decide.witness")
        + "\nfrom aggregator.kube.client import KubeClient\n"
    }
    paths = io_reached("aggregator.decide.decider", lambda n: via.get(n) or module_source(n))
    assert (
        "aggregator.decide.decider -> aggregator.decide.witness -> aggregator.kube.client -> aiohttp" in paths
    ), paths


def first_cycle(
    source_of: Callable[[str], str] = module_source, packages: tuple[str, ...] = ("aggregator", "core")
) -> str:
    """``a -> b -> a`` for the first import cycle among the modules of ``packages``, "" when none
    (TYPE_CHECKING imports count too: a type that names its user is the same knot)."""
    modules = sorted({m for pkg in packages for m in modules_of(pkg)})
    done: set[str] = set()

    def walk(name: str, path: tuple[str, ...]) -> str:
        if name in path:
            return " -> ".join((*path[path.index(name) :], name))
        if name in done or name not in modules:
            return ""
        imports = {m for _, m in imported_modules(ast.parse(source_of(name)))}
        for nxt in sorted(imports):
            if found := walk(nxt, (*path, name)):
                return found
        done.add(name)
        return ""

    return next((c for m in modules if (c := walk(m, ()))), "")


def test_no_import_cycle_among_the_aggregators_modules() -> None:
    assert first_cycle() == ""


def test_no_import_cycle_among_the_harness_modules() -> None:
    assert first_cycle(packages=("testenv",)) == ""


def test_a_planted_cycle_is_reported_with_its_path() -> None:
    planted = {
        "aggregator.report": module_source("aggregator.report")
        + "\nif TYPE_CHECKING:\n    from aggregator.target import Target\n"
    }
    cycle = first_cycle(lambda n: planted.get(n) or module_source(n)).split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"aggregator.report", "aggregator.target"}, cycle
    # In one room of the harness: the registration reaching back for the apply that reads it.
    planted = {
        "testenv.gardener.registration": module_source("testenv.gardener.registration")
        + "\nfrom testenv.gardener import apply\n"
    }
    cycle = first_cycle(lambda n: planted.get(n) or module_source(n), ("testenv",)).split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {
        "testenv.gardener.registration",
        "testenv.gardener.apply",
    }, cycle


# -- the size of a module: one concern each (docs/design.md, "The tree")

MAX_LINES = 450


def test_no_module_of_the_aggregator_is_longer_than_its_concern_allows() -> None:
    long = {m: n for m in aggregator_modules() if (n := module_source(m).count("\n")) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
