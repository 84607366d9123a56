"""Pins every dependency of pyproject.toml to the floor it declares (``>=X`` becomes ``==X``):
the constraints for ``make lowest``, which runs the unit tests on the oldest versions the
project claims to support."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

meta = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
deps = [*meta["dependencies"], *meta["optional-dependencies"]["aggregator"]]
for dep in deps:
    m = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*>=\s*([^,;\s]+)", dep)
    if m is None:
        sys.exit(f"lowest: {dep!r} declares no floor (>=): every dependency needs one")
    marker = dep.split(";", 1)[1].strip() if ";" in dep else ""
    print(f"{m.group(1)}=={m.group(3)}" + (f"; {marker}" if marker else ""))
