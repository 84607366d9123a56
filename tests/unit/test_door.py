"""The garden's door (aggregator/model/door.py): rendered from the aggregator's own rules, kept
in manifests/, and one rule for each field a providerConfig may set. What the real
gardener-apiserver makes of it is tests/integration/test_garden.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.model import door, protection
from aggregator.model.protection import KNOWN, OVERRIDES
from core.config import Var
from core.errors import ConfigError
from tests.unit.door_corpus import corpus

ROOT = Path(__file__).resolve().parents[2]


def test_the_manifest_is_the_rendering() -> None:
    assert (ROOT / door.TARGET).read_text() == door.manifest(), "run make manifests"


def test_every_field_has_its_rule_and_names_itself() -> None:
    messages = " ".join(v["message"] for v in door.validations())
    for key in KNOWN:
        assert key in messages, key
    assert all(v["message"].startswith(door.AT) for v in door.validations())


def test_a_setting_of_a_kind_the_door_cannot_judge_stops_the_rendering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(OVERRIDES, "leaseDuration", OVERRIDES["failureFraction"])
    monkeypatch.setattr(protection, "override_var", lambda key: Var("DWD_X", "duration"))
    monkeypatch.setattr(door, "override_var", protection.override_var)
    with pytest.raises(ValueError, match="no door rule for a duration setting"):
        door.validations()


def test_the_corpus_has_both_verdicts() -> None:
    """The corpus the integration test sends through the door: the aggregator's own rules take
    some and refuse others (a corpus of one verdict would prove nothing)."""
    verdicts = []
    for _, config in corpus():
        try:
            protection.check(config)
            verdicts.append(True)
        except ConfigError:
            verdicts.append(False)
    print(f"\n{len(verdicts)} configs: {sum(verdicts)} good, {len(verdicts) - sum(verdicts)} bad")
    assert sum(verdicts) >= 30 and len(verdicts) - sum(verdicts) >= 40
