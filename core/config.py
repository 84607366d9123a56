"""Reading settings from the environment: every variable parsed, every problem reported at once.

Both sides build one frozen dataclass through an EnvReader; ``finish()`` raises
a single ConfigError that names every bad variable, so an operator fixes a
manifest in one round instead of one variable per crash loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from core.durations import format_duration, parse_duration
from core.errors import ConfigError
from core.logs import LEVELS, LogFormat

# ConfigError lives with the other errors; the agent still catches it from here.
__all__ = ["ConfigError", "EnvReader", "Var", "read_var", "read_vars", "settings_help", "var", "variables"]

T = TypeVar("T", bound=str)


class EnvReader:
    """Typed access to environment variables that records problems instead of raising.

    ``renamed`` (old name -> new) and ``retired`` (name -> why) are the settings of the release
    before: a renamed one is still read under its old name, a retired one accepted and ignored,
    each with a warning (``deprecated``) that names what to do. Failing on them would turn a
    rollout, or a rollback under the newer manifests, into a crash loop."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        renamed: Mapping[str, str] | None = None,
        retired: Mapping[str, str] | None = None,
    ) -> None:
        self.env = env
        self.problems: list[str] = []
        # Every variable asked for, with its default as shown: what this program knows
        # (``unknown``) and what ``--help`` lists.
        self.asked: dict[str, str] = {}
        self.renamed = dict(renamed or {})
        self.retired = dict(retired or {})

    def _raw(self, name: str, default: object = "") -> str | None:
        self.asked.setdefault(name, default if isinstance(default, str) else format_default(default))
        value = self.env.get(name)
        if value is None or value.strip() == "":
            value = next((self.env.get(old) for old, new in self.renamed.items() if new == name), None)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def deprecated(self) -> list[str]:
        """A warning for each setting of the release before that is set: what to do about it."""
        out = []
        for old, new in sorted(self.renamed.items()):
            if old in self.env:
                if self.env.get(new, "").strip():
                    out.append(f"{old}: renamed {new}, which is set too and is the one read: remove {old}")
                else:
                    out.append(f"{old}: renamed {new}, read as {new} for this release: rename it")
        out += [
            f"{name}: no longer read ({why}): remove it"
            for name, why in sorted(self.retired.items())
            if name in self.env
        ]
        return out

    def problem(self, name: str, message: str) -> None:
        self.problems.append(f"{name}: {message}")

    def string(self, name: str, default: str = "", *, required: bool = False) -> str:
        value = self._raw(name, "(required)" if required else default)
        if value is None:
            if required:
                self.problem(name, "is required")
            return default
        return value

    def duration(self, name: str, default: str, *, min_s: float = 0.0, max_s: float | None = None) -> float:
        text = self._raw(name, default) or default
        try:
            seconds = parse_duration(text)
        except ValueError as e:
            self.problem(name, str(e))
            return parse_duration(default)
        if seconds < min_s or (max_s is not None and seconds > max_s):
            allowed = (
                f"at least {format_duration(min_s)}"
                if max_s is None
                else f"between {format_duration(min_s)} and {format_duration(max_s)}"
            )
            self.problem(name, f"{text} is out of range ({allowed})")
            return parse_duration(default)  # so no relation with another setting blames that one
        return seconds

    def fraction(self, name: str, default: float) -> float:
        text = self._raw(name, default)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            self.problem(name, f"{text!r} is not a number")
            return default
        if not 0.0 < value <= 1.0:
            self.problem(name, f"{text} is not a fraction in (0, 1]")
            return default
        return value

    def integer(self, name: str, default: int, *, min_value: int | None = None) -> int:
        text = self._raw(name, default)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            self.problem(name, f"{text!r} is not an integer")
            return default
        if min_value is not None and value < min_value:
            self.problem(name, f"{value} is below the minimum {min_value}")
            return default
        return value

    def number(self, name: str, default: float, *, min_value: float = 0.0) -> float:
        text = self._raw(name, default)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            self.problem(name, f"{text!r} is not a number")
            return default
        if not value > min_value:
            self.problem(name, f"{text} must be greater than {min_value:g}")
            return default
        return value

    def boolean(self, name: str, default: bool) -> bool:
        text = self._raw(name, default)
        if text is None:
            return default
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        self.problem(name, f"{text!r} is not a boolean (true or false)")
        return default

    def choice(self, name: str, default: T, choices: Sequence[T]) -> T:
        text = self._raw(name, f"{default} (or {', '.join(c for c in choices if c != default)})")
        if text is None:
            return default
        for c in choices:
            if text.lower() == c:
                return c
        self.problem(name, f"{text!r} is not one of {', '.join(choices)}")
        return default

    def address(self, name: str) -> tuple[str, int] | None:
        """``host:port`` (``:port`` binds every interface); empty means off."""
        text = self._raw(name, "(off)")
        if text is None:
            return None
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            self.problem(name, f"{text!r} is not host:port")
            return None
        return (host.strip("[]") or "0.0.0.0", int(port))

    def logging(self) -> tuple[LogFormat, str]:
        """DWD_LOG_FORMAT and DWD_LOG_LEVEL, the same on both sides."""
        fmt: LogFormat = self.choice("DWD_LOG_FORMAT", "auto", ("json", "console", "auto"))
        return fmt, self.choice("DWD_LOG_LEVEL", "info", LEVELS)

    def also(self, *names: str) -> None:
        """Variables this program knows that this run did not read (one setting that overrides
        another): not unknown when set."""
        for name in names:
            self.asked.setdefault(name, "")

    def unknown(self, prefix: str = "DWD_", ignore: Collection[str] = ()) -> list[str]:
        """Every set variable with ``prefix`` that nothing asked for, with the nearest known name:
        a typo that would otherwise be silently ignored (``DWD_DRYRUN=true``: live scaling where
        the operator asked for none). Call it after everything was read."""
        known = sorted(self.asked)
        out = []
        for name in sorted(n for n in self.env if n.startswith(prefix) and n not in self.asked):
            if name in ignore or name in self.renamed or name in self.retired:
                continue
            import difflib  # noqa: PLC0415 (only for a setting nobody knows: not in every agent's memory)

            near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            out.append(f"{name}: not a setting{f' (did you mean {near[0]}?)' if near else ''}")
        return out

    def finish(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)


def format_default(value: object) -> str:
    """A default as an operator would write it."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def settings_help(read: Callable[[EnvReader], object]) -> str:
    """The variables ``read`` asks for, with their defaults, in the order it reads them: read
    from an empty environment, so the list is what the program does, not a copy of it."""
    r = EnvReader({})
    with contextlib.suppress(ConfigError):  # required variables are missing from an empty environment
        read(r)
    width = max(map(len, r.asked), default=0)
    return "\n".join(f"  {name:<{width}}  {default or '(empty)'}" for name, default in r.asked.items())


Kind = Literal["duration", "fraction", "number", "integer", "boolean", "string"]


@dataclass(frozen=True)
class Var:
    """The environment variable a settings field is read from, and how."""

    name: str
    kind: Kind
    # EnvReader's bounds of that kind: min_s/max_s (duration), min_value (integer, number).
    bounds: Mapping[str, float] = field(default_factory=dict)


def var(name: str, default: Any, kind: Kind, **bounds: float) -> Any:
    """A settings field read from ``name``: its default is written here only, and ``from_env``,
    the benchmarks and the docs' tables (checked by tests/unit/test_settings_docs.py) take it
    from the field."""
    return field(default=default, metadata={"env": Var(name, kind, bounds)})


def variables(cls: type) -> list[tuple[dataclasses.Field[Any], Var]]:
    """The fields of a settings dataclass that are read from the environment."""
    return [(f, f.metadata["env"]) for f in dataclasses.fields(cls) if "env" in f.metadata]


def read_vars(r: EnvReader, cls: type) -> dict[str, Any]:
    """Every ``var`` field of ``cls`` from the environment, by field name, each defaulting to
    its field's default."""
    return {f.name: read_var(r, f, v) for f, v in variables(cls)}


def value_problem(v: Var, value: object) -> str | None:
    """What is wrong with ``value``, a JSON value given for ``v``'s setting (a shoot's
    providerConfig: aggregator/model/protection.py), in the words a bad variable gets; None when
    it is one. Booleans and fractions, the kinds a JSON value is given for."""
    if v.kind == "boolean":
        return None if isinstance(value, bool) else f"{value!r} is not a boolean (true or false)"
    if v.kind != "fraction":
        raise TypeError(f"{v.name}: a {v.kind} is not given as a JSON value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value!r} is not a number"
    return None if 0.0 < value <= 1.0 else f"{value} is not a fraction in (0, 1]"


def read_var(r: EnvReader, f: dataclasses.Field[Any], v: Var, name: str = "") -> Any:
    """One ``var`` field read as its kind says, from ``name`` (its variable's by default: a
    shoot's providerConfig reads the same field under its own key, aggregator/model/protection.py),
    defaulting to the field's default; a bad value is a problem of ``r`` that names ``name``."""
    if f.default is dataclasses.MISSING:
        raise TypeError(f"{f.name}: a variable's field needs its default")
    default: Any = f.default
    b, name = v.bounds, name or v.name
    if v.kind == "duration":
        return r.duration(name, format_duration(default), min_s=b.get("min_s", 0.0), max_s=b.get("max_s"))
    if v.kind == "fraction":
        return r.fraction(name, default)
    if v.kind == "number":
        return r.number(name, default, min_value=b.get("min_value", 0.0))
    if v.kind == "integer":
        low = b.get("min_value")
        return r.integer(name, default, min_value=None if low is None else int(low))
    if v.kind == "boolean":
        return r.boolean(name, default)
    return r.string(name, default)
