"""Reading settings from the environment: every variable parsed, every problem reported at once.

Both sides build one frozen dataclass through an EnvReader; ``finish()`` raises
a single ConfigError that names every bad variable, so an operator fixes a
manifest in one round instead of one variable per crash loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from core.durations import format_duration, parse_duration
from core.errors import ConfigError
from core.logs import LEVELS, LogFormat

# ConfigError lives with the other errors; the agent still catches it from here.
__all__ = ["ConfigError", "EnvReader"]

T = TypeVar("T", bound=str)


class EnvReader:
    """Typed access to environment variables that records problems instead of raising."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []

    def _raw(self, name: str) -> str | None:
        value = self.env.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def problem(self, name: str, message: str) -> None:
        self.problems.append(f"{name}: {message}")

    def string(self, name: str, default: str = "", *, required: bool = False) -> str:
        value = self._raw(name)
        if value is None:
            if required:
                self.problem(name, "is required")
            return default
        return value

    def duration(self, name: str, default: str, *, min_s: float = 0.0, max_s: float | None = None) -> float:
        text = self._raw(name) or default
        try:
            seconds = parse_duration(text)
        except ValueError as e:
            self.problem(name, str(e))
            return parse_duration(default)
        if seconds < min_s or (max_s is not None and seconds > max_s):
            upper = f" and {format_duration(max_s)}" if max_s is not None else ""
            self.problem(name, f"{text} is out of range (between {format_duration(min_s)}{upper})")
        return seconds

    def fraction(self, name: str, default: float) -> float:
        text = self._raw(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            self.problem(name, f"{text!r} is not a number")
            return default
        if not 0.0 < value <= 1.0:
            self.problem(name, f"{text} is not a fraction in (0, 1]")
        return value

    def integer(self, name: str, default: int, *, min_value: int | None = None) -> int:
        text = self._raw(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            self.problem(name, f"{text!r} is not an integer")
            return default
        if min_value is not None and value < min_value:
            self.problem(name, f"{value} is below the minimum {min_value}")
        return value

    def number(self, name: str, default: float, *, min_value: float = 0.0) -> float:
        text = self._raw(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            self.problem(name, f"{text!r} is not a number")
            return default
        if not value > min_value:
            self.problem(name, f"{text} must be greater than {min_value:g}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        text = self._raw(name)
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
        text = self._raw(name)
        if text is None:
            return default
        for c in choices:
            if text.lower() == c:
                return c
        self.problem(name, f"{text!r} is not one of {', '.join(choices)}")
        return default

    def address(self, name: str) -> tuple[str, int] | None:
        """``host:port`` (``:port`` binds every interface); empty means off."""
        text = self._raw(name)
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

    def finish(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)
