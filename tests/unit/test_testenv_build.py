"""``python -m testenv build --demo`` builds only what ``make demo`` runs; without it, everything."""

from __future__ import annotations

import pytest

from testenv import __main__ as cli
from testenv import binaries


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["build", "--demo"], {"kube-apiserver", "kube-controller-manager", "kubemark", "etcd"}),
        (
            ["build"],
            {c.name for c in binaries.COMPONENTS} | {"gardener-resource-manager", "dependency-watchdog"},
        ),
    ],
)
def test_build_asks_for_what_it_is_for(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], wanted: set[str]
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(binaries, "build", lambda *, force, only: asked.extend(c.name for c in only) or {})
    monkeypatch.setattr(cli.grm, "build", lambda *, force: asked.append("gardener-resource-manager"))
    monkeypatch.setattr(
        cli.dependency_watchdog, "build", lambda *, force: asked.append("dependency-watchdog")
    )
    assert cli.main(argv) == 0
    assert sorted(asked) == sorted(wanted)
