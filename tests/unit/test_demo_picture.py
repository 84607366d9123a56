"""The demo's picture (demo/picture.py) of a synthetic race: both worlds' series on one axis from
the cut, the marks where the acts set them, and an SVG an XML parser reads."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from demo import picture
from demo.track import Track
from tests.unit import demo_timeline as race

NS = {"svg": "http://www.w3.org/2000/svg"}
SUMMARY = "the same cut, side by side: <both> & KCM stopped 9s after the cut"


def drawn() -> ET.Element:
    return ET.fromstring(picture.svg([race.unprotected(), race.protected()], SUMMARY))


def worlds(root: ET.Element) -> dict[str, ET.Element]:
    return {g.get("data-world", ""): g for g in root.iterfind(".//svg:g[@class='world']", NS)}


def series(world: ET.Element) -> dict[str, str]:
    """Each series' tooltip: its values and from when."""
    return {
        p.get("data-series", ""): p.findtext("svg:title", "", NS)
        for p in world.iterfind("svg:path[@class='series']", NS)
    }


def marks(world: ET.Element) -> dict[str, float]:
    return {
        m.get("data-mark", ""): float(m.get("x1", "nan"))
        for m in world.iterfind("svg:line[@class='mark']", NS)
    }


def test_both_worlds_are_drawn_with_every_series() -> None:
    root = drawn()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    found = worlds(root)
    assert list(found) == ["no protection", "protection"]
    for world in found.values():
        assert list(series(world)) == ["leases renewed", "KCM replicas", "nodes Unknown", "ready endpoints"]
    text = " ".join(t.text or "" for t in root.iterfind(".//svg:text", NS))
    assert SUMMARY in text  # escaped in the file, the same text once parsed


def test_each_series_says_what_the_samples_say_from_the_cut() -> None:
    found = worlds(drawn())
    unprotected, protected = series(found["no protection"]), series(found["protection"])
    assert protected["KCM replicas"] == "KCM replicas: 3 from -10.0s, 0 from +9.0s, 3 from +60.0s"
    assert unprotected["KCM replicas"] == "KCM replicas: 3 from -10.0s"
    assert protected["nodes Unknown"] == "nodes Unknown: 0 from -10.0s"
    assert unprotected["nodes Unknown"].startswith(
        "nodes Unknown: 0 from -10.0s, 1 from +33.0s, 2 from +34.0s"
    )
    assert "10 from +42.0s, 0 from +95.0s" in unprotected["nodes Unknown"]
    assert unprotected["ready endpoints"].endswith("0 from +42.0s, 10 from +95.0s")


def test_the_marks_are_where_the_acts_set_them_on_one_axis() -> None:
    found = worlds(drawn())
    left, right = marks(found["no protection"]), marks(found["protection"])
    assert set(left) == {"cut", "heal"}  # KCM never went to 0 without protection
    assert set(right) == {"cut", "KCM at 0", "heal"}
    axis = picture.axis_of([race.unprotected(), race.protected()])
    assert (axis.start_s, axis.end_s) == (-10.0, 100.0)
    per_s = picture.COLUMN / axis.span
    column = picture.COLUMN + picture.GAP
    px = 0.11  # written to a tenth of a pixel
    assert left["cut"] == pytest.approx(picture.LEFT + 10 * per_s, abs=px)
    assert right["cut"] == pytest.approx(left["cut"] + column, abs=px)  # the same moment in both columns
    assert right["KCM at 0"] - right["cut"] == pytest.approx(9 * per_s, abs=px)
    assert left["heal"] - left["cut"] == pytest.approx(50 * per_s, abs=px)
    assert right["heal"] - right["cut"] == pytest.approx(50 * per_s, abs=px)


def test_a_series_step_line_holds_each_value_until_the_next() -> None:
    axis = picture.Axis(-10, 100)
    points = [(-30.0, 3), (-20.0, 3), (-5.0, 3), (9.0, 0), (9.5, 0), (60.0, 3), (120.0, 3)]
    assert picture.steps(points, axis) == [(-10, 3), (9.0, 0), (60.0, 3)]
    assert picture.path([(0.0, 5.0), (10.0, 20.0)]) == "M0.0,5.0H10.0V20.0"
    d = re.findall(r"[MHV][0-9.,]+", picture.path([(0.0, 5.0), (10.0, 20.0), (30.0, 5.0)]))
    assert d == ["M0.0,5.0", "H10.0", "V20.0", "H30.0", "V5.0"]


def test_a_world_without_samples_or_a_cut_still_parses() -> None:
    root = ET.fromstring(picture.svg([Track("empty")]))
    assert list(worlds(root)) == ["empty"] and series(worlds(root)["empty"]) == {}
