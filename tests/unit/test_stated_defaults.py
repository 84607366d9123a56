"""A default is written once, in its settings field (core.config.var): a comment or docstring of
the Python trees that gives a setting a value gives the field's, or this fails naming the line
(tests/unit/test_settings_docs.py holds the docs' tables to the same).

A statement is a setting's name next to a number with its unit: the variable, the field or
the words prose uses for it, before the number ("lease duration of N s", "confirm N s", "the
lease duration (N s)", ``DWD_LEASE_DURATION=N``) or after it ("an N s lease duration", "N s
of confirm"). Where two names claim one number the longer wins: "leader lease duration" is
the leader's, "kubelet's lease" nobody's. Not a default: a value dated as history ("N s
before 2026-12-05"), and a value the file itself gives the setting in code, directly or
through a settings mapping it names (``FAST_ENV``): a test's or a benchmark's own choice.
Strings and booleans are left out: their words are too common to find a statement by.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.settings import Settings as AgentSettings
from aggregator.model.settings import (
    DeciderSettings,
    LeaderSettings,
    ProvisionSettings,
    ScaleSettings,
    ShootSettings,
)
from core.config import variables
from core.durations import parse_duration

ROOT = Path(__file__).resolve().parents[2]
TREES = ("agent", "aggregator", "bench", "core", "demo", "image", "testenv", "tests")

# Words that name a setting besides its variable's and its field's, as the code's prose says them.
ALIASES = {
    "DWD_CONFIRM_PERIOD": ("confirm", "confirmation"),
    "DWD_RECOVERY_PERIOD": ("recovery",),
    "DWD_RENEW_INTERVAL": ("renewal interval", "agent's interval"),
    "DWD_LEASE_DURATION": ("lease",),
    "DWD_MIN_CANDIDATES": ("minimum candidates",),
}
# Too common after a number for a setting ("KCM's own defaults: 15 s lease"): a name before one only.
BEFORE_ONLY = frozenset({"lease"})
# Other things' names, which claim a number where they are the longer: their values are not ours.
OTHERS = ("kubelet lease", "kubelet's lease", "kubelet's lease duration", "leader's lease", "node lease")

# Where a comment gives a setting another value on purpose: (file, text of the line, why).
ALLOWED = (
    ("testenv/kube/hollow.py", "lease duration 40 s", "the kubelet's own lease, as kubemark configures it"),
    ("tests/unit/test_interleavings.py", "(17 s before)", "how long the same took before the fix"),
)

UNITS_S = {"ms": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "min": 60.0}
UNITS_S |= {"minute": 60.0, "minutes": 60.0, "m": 60.0, "h": 3600.0}
TIME_UNIT = "|".join(sorted(UNITS_S, key=len, reverse=True))
VALUE = rf"(?<![\w.])(?P<number>\d+(?:\.\d+)?)(?![\d.]\d)(?:[\s-]?(?P<unit>{TIME_UNIT})\b|(?P<per>\s?%|/s))?"
BEFORE = r"`{0,2}(?:\s*[=:(]\s*|\s+(?:of|is|at|default)\s+|\s+)`{0,2}"
AFTER = r"`{0,2}\s+(?:of\s+)?"
DATED = re.compile(r"\s+(?:before|until)\s+\d{4}-\d\d-\d\d")


@dataclass(frozen=True)
class Setting:
    variable: str
    field: str
    kind: str
    default: float


@dataclass(frozen=True)
class Statement:
    """``text`` gives ``variable`` the ``value`` at ``offset`` (the number's)."""

    variable: str
    value: float
    offset: int


def numeric_settings() -> dict[str, Setting]:
    """Every duration, fraction, number and integer variable of both sides, by variable."""
    out = {}
    for cls in (
        DeciderSettings,
        LeaderSettings,
        ProvisionSettings,
        ScaleSettings,
        ShootSettings,
        AgentSettings,
    ):
        for f, v in variables(cls):
            if v.kind in ("duration", "fraction", "number", "integer") and isinstance(f.default, int | float):
                out[v.name] = Setting(v.name, f.name, v.kind, float(f.default))
    return out


SETTINGS = numeric_settings()


def normal(name: str) -> str:
    return re.sub(r"[\s-]+", " ", name.lower())


def all_names() -> dict[str, str | None]:
    """Every name in prose -> the variable it names (None: another thing's). A field's name
    (and its words) that two settings share, as the leader's and the decider's
    ``lease_duration_s``, names neither: their variables' names do."""
    out: dict[str, str | None] = {normal(o): None for o in OTHERS}
    for variable in SETTINGS:
        for name in (variable, variable.removeprefix("DWD_").replace("_", " "), *ALIASES.get(variable, ())):
            assert out.setdefault(normal(name), variable) == variable, f"{name} names two settings"
    fields = [(s.field, s.variable) for s in SETTINGS.values()] + [("fast_interval_s", "DWD_RENEW_INTERVAL")]
    by_name: dict[str, set[str]] = {}
    for field, variable in fields:
        for name in (field, field.removesuffix("_s").replace("_", " ")):
            by_name.setdefault(normal(name), set()).add(variable)
    return {name: variables.pop() for name, variables in by_name.items() if len(variables) == 1} | out


NAMES = all_names()


def alternation(names: Iterable[str]) -> str:
    """The names longest first, each as prose may break it (a line's end, a hyphen)."""
    spelled = [r"[\s-]+".join(map(re.escape, n.split(" "))) for n in sorted(names, key=len, reverse=True)]
    firsts = "".join(sorted({c for n in names for c in (n[0].lower(), n[0].upper())}))
    # The lookahead first: it spares trying every name at every letter (three times faster).
    return rf"(?<![\w'-])(?=[{firsts}])(?P<name>" + "|".join(spelled) + r")\b"


NAME_BEFORE = re.compile(alternation(NAMES) + BEFORE + VALUE, re.IGNORECASE)
NAME_AFTER = re.compile(VALUE + AFTER + alternation(set(NAMES) - BEFORE_ONLY), re.IGNORECASE)


def value_of(m: re.Match[str], kind: str) -> float | None:
    """The value in seconds for a duration (a bare number only after a variable's name), as a
    fraction or a number otherwise; None where the unit is not of the setting's kind."""
    number, unit, per = float(m["number"]), m["unit"], (m["per"] or "").strip()
    if kind == "duration" and unit:
        return number * UNITS_S[unit.lower()]
    if kind == "duration":
        return number if not per and m["name"].isupper() else None
    if unit or (per == "%" and kind != "fraction"):
        return None
    return number / 100 if per == "%" else number


def statements(text: str) -> list[Statement]:
    """Every value ``text`` gives a setting, by the longer of the names before and after it."""
    claims: dict[int, tuple[int, Statement | None]] = {}
    for pattern in (NAME_BEFORE, NAME_AFTER):
        for m in pattern.finditer(text):
            variable = NAMES[normal(m["name"])]
            value = value_of(m, SETTINGS[variable].kind) if variable else None
            end = max(m.end("number"), m.end("unit"), m.end("per"))
            if variable is None or value is None or DATED.match(text, end):
                statement = None
            else:
                statement = Statement(variable, value, m.start("number"))
            if len(m["name"]) > claims.get(m.start("number"), (0, None))[0]:
                claims[m.start("number")] = (len(m["name"]), statement)
    return sorted((s for _, s in claims.values() if s is not None), key=lambda s: s.offset)


def prose(tree: ast.AST, source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of every docstring and every run of comment lines."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.lineno, node.value.value
    run: list[str] = []
    first = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            if run and token.start[0] != first + len(run):
                yield first, "\n".join(run)
                run = []
            first = first if run else token.start[0]
            run.append(token.string.lstrip("#").strip())
    if run:
        yield first, "\n".join(run)


def fields_by_name() -> dict[str, set[str]]:
    """A field's name -> the variables of the fields so named (the leader's and the decider's
    ``lease_duration_s``: both, a keyword's value gives neither away)."""
    out: dict[str, set[str]] = {"fast_interval_s": {"DWD_RENEW_INTERVAL"}}
    for s in SETTINGS.values():
        out.setdefault(s.field, set()).add(s.variable)
    return out


FIELDS = fields_by_name()


Chosen = set[tuple[str, float]]


def given(node: ast.AST) -> Chosen:
    """(variable, value) of every setting ``node`` gives a value in code: a mapping's
    ``"DWD_X": "8s"``, a keyword's ``DWD_X="8s"`` or ``lease_duration_s=8.0``."""
    pairs: list[tuple[object, ast.expr]] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Dict):
            pairs += [
                (k.value, v) for k, v in zip(n.keys, n.values, strict=True) if isinstance(k, ast.Constant)
            ]
        elif isinstance(n, ast.keyword) and n.arg:
            pairs.append((n.arg, n.value))
    out = set()
    for key, value in pairs:
        if not isinstance(value, ast.Constant) or not isinstance(key, str):
            continue
        for variable in {key} & set(SETTINGS) or FIELDS.get(key, set()):
            raw = value.value
            if isinstance(raw, str) and SETTINGS[variable].kind == "duration":
                with contextlib.suppress(ValueError):  # a test's bad value
                    out.add((variable, parse_duration(raw)))
            elif isinstance(raw, int | float) and not isinstance(raw, bool):
                out.add((variable, float(raw)))
    return out


def named_settings(tree: ast.Module) -> dict[str, Chosen]:
    """The settings mappings a module names: a constant (``FAST_ENV = {...}``), a function or
    method named for one (``election_env``). Not any function: "run" is in every file."""
    out = {}
    body = [*tree.body, *(n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)]
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.endswith("_env"):
            out[node.name] = given(node)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            out |= {t.id: given(node) for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()}
    return {name: values for name, values in out.items() if values}


def line_at(first: int, text: str, offset: int) -> int:
    """The line of ``offset`` in a text that starts on line ``first``."""
    return first + text.count("\n", 0, offset)


def stale(
    source: str, chosen: Chosen | None = None, tree: ast.AST | None = None
) -> list[tuple[int, str, float]]:
    """(line, variable, value) of every statement in ``source``'s prose that gives a setting
    neither its field's default nor a value the code (or ``chosen``) gives it."""
    tree = tree or ast.parse(source)
    kept = {(v, round(x, 6)) for v, x in (chosen or set()) | given(tree)}
    kept |= {(v, round(s.default, 6)) for v, s in SETTINGS.items()}
    return sorted(
        (line_at(first, text, s.offset), s.variable, s.value)
        for first, text in prose(tree, source)
        for s in statements(text)
        if (s.variable, round(s.value, 6)) not in kept
    )


def python_files() -> Iterator[Path]:
    for tree in TREES:
        yield from (p for p in sorted((ROOT / tree).rglob("*.py")) if "go" not in p.relative_to(ROOT).parts)


SETS_A_VARIABLE = re.compile(r"[\"']DWD_[A-Z_]+[\"']\s*:")
COMMENT_MARK = re.compile(r"\n[ \t]*#+[ \t]*")


def may_state(text: str) -> bool:
    """Whether ``text`` may hold a statement off its default, read as one: a cheap look first,
    so that only those files are parsed."""
    joined = COMMENT_MARK.sub("\n", text)
    return any(s.value != SETTINGS[s.variable].default for s in statements(joined))


def findings() -> list[str]:
    sources = {path: path.read_text() for path in python_files()}
    trees = {path: ast.parse(text) for path, text in sources.items() if SETS_A_VARIABLE.search(text)}
    named: dict[str, Chosen] = {}
    for tree in trees.values():
        named |= named_settings(tree)
    out = []
    for path, text in sources.items():
        if not may_state(text):
            continue
        chosen = set().union(*(v for name, v in named.items() if re.search(rf"\b{name}\b", text)))
        where = str(path.relative_to(ROOT))
        for line, variable, value in stale(text, chosen, trees.get(path)):
            if not any(where == f and s in text.splitlines()[line - 1] for f, s, _ in ALLOWED):
                default = SETTINGS[variable].default
                out.append(f"{where}:{line}: {variable} {value:g}, its field's default {default:g}")
    return out


def test_no_comment_or_docstring_states_another_default() -> None:
    found = findings()
    assert not found, "say why and name the setting, not its number (the field has it):\n" + "\n".join(found)


def test_the_check_reads_the_ways_a_default_is_stated() -> None:
    lease, confirm = SETTINGS["DWD_LEASE_DURATION"].default, SETTINGS["DWD_CONFIRM_PERIOD"].default
    leader, off = SETTINGS["DWD_LEADER_LEASE_DURATION"].default, lease + 2
    recovery, fraction = SETTINGS["DWD_RECOVERY_PERIOD"].default, SETTINGS["DWD_FAILURE_FRACTION"].default
    source = (
        f'"""At an {off:g}-second lease\n'  # 1: after the number, the name broken by a line's end
        f'duration, with ``DWD_CONFIRM_PERIOD={confirm + 1:g}``."""\n'  # 2: a variable, its unit implied
        f"# the lease duration of {off:g}s, confirm {confirm + 1:g} s, recovery {recovery:g} s,\n"  # 3
        f"# the failure fraction {fraction / 2:g}, lease\n"  # 4: a fraction; a name across comment lines
        f"# duration ({off:g} s)\n"  # 5
        f"x = 'a lease duration of {off:g} s'  # a string, not prose\n"  # 6
        f"# the leader lease duration {leader:g} s, the kubelet's lease duration 40 s\n"  # 7
        f"# the lease duration {off:g} s before 2026-12-05, {lease:g} s since\n"  # 8
        f"# confirm {confirm:g} s and an {lease:g} s lease duration\n"  # 9
        f"World(confirm_period_s={confirm + 2:g})  # confirm {confirm + 2:g} s: this test's own\n"  # 10
    )
    assert stale(source) == [
        (1, "DWD_LEASE_DURATION", off),
        (2, "DWD_CONFIRM_PERIOD", confirm + 1),
        (3, "DWD_CONFIRM_PERIOD", confirm + 1),
        (3, "DWD_LEASE_DURATION", off),
        (4, "DWD_FAILURE_FRACTION", fraction / 2),
        (5, "DWD_LEASE_DURATION", off),
    ]


def test_a_value_a_named_settings_mapping_gives_is_a_choice() -> None:
    chosen = SETTINGS["DWD_LEASE_DURATION"].default + 3
    named = named_settings(ast.parse(f'FAST = {{"DWD_LEASE_DURATION": "{chosen:g}s"}}\nfast = FAST\n'))
    assert named == {"FAST": {("DWD_LEASE_DURATION", chosen)}}
    source = f"# under FAST: a lease duration of {chosen:g} s\n"
    assert stale(source, named["FAST"]) == []
    assert stale(source) == [(1, "DWD_LEASE_DURATION", chosen)]


HTTP_LIBRARIES = ("httpx", "aiohttp", "requests", "urllib3", "h11", "h2")
_LIBRARY = "(?P<library>" + "|".join(HTTP_LIBRARIES) + ")"
_SIDE = "(?P<side>agent|aggregator)"
CLAIMS = [
    re.compile(rf"\b{_LIBRARY}\s+(?:in|for|of)\s+the\s+{_SIDE}\b", re.IGNORECASE),
    re.compile(rf"\bthe\s+{_SIDE}(?:'s|\s+uses|\s+speaks)\s+{_LIBRARY}\b", re.IGNORECASE),
]


def claims(text: str) -> list[tuple[int, str, str]]:
    """(offset, side, library) of every "httpx in the agent", "the agent uses httpx", "the
    agent's httpx"."""
    return sorted(
        (m.start(), m["side"].lower(), m["library"].lower()) for c in CLAIMS for m in c.finditer(text)
    )


def imported(package: str) -> set[str]:
    """The top-level modules that ``package``'s modules import."""
    out = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.add(node.module.split(".")[0])
    return out


def test_the_http_library_a_comment_gives_a_side_is_the_one_it_imports() -> None:
    uses = {side: imported(side) for side in ("agent", "aggregator")}
    assert {"h11", "h2"} <= uses["agent"] and "aiohttp" in uses["aggregator"]  # the reader reads
    sample = "HTTP (httpx in the agent, aiohttp in the aggregator), the agent's h2; the agent uses\nh11"
    assert [(side, library) for _, side, library in claims(sample)] == [
        ("agent", "httpx"),
        ("aggregator", "aiohttp"),
        ("agent", "h2"),
        ("agent", "h11"),
    ]
    found = [
        f"{path.relative_to(ROOT)}:{line_at(first, said, at)}: {library} in the {side}, "
        "which does not import it"
        for package in ("agent", "aggregator", "core")
        for path in sorted((ROOT / package).rglob("*.py"))
        if re.search("|".join(HTTP_LIBRARIES), text := path.read_text())
        for first, said in prose(ast.parse(text), text)
        for at, side, library in claims(said)
        if library not in uses[side]
    ]
    assert not found, "\n".join(found)
