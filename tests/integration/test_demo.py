"""``make demo`` end to end: both acts on the same cut, real KCM processes, the aggregator's
real defaults. What its closing lines say is what this asserts."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from demo import picture, scenario
from tests import chromium


@pytest.mark.timeout(600)
def test_the_demo_shows_kcm_marking_the_nodes_without_protection_and_nothing_with_it(tmp_path: Path) -> None:
    out = io.StringIO()
    m = scenario.run(out=out, picture=tmp_path / "race.svg")
    # Act 1: KCM alone marks every node once its 40 s grace has passed since the kubelet's last
    # renewal (up to 10 s before the cut), and their endpoints go.
    assert m["unprotected_unknown"] == 10, out.getvalue()
    assert 30 <= m["unprotected_first_unknown_s"] <= 60
    assert m["unprotected_endpoints_min"] == 0
    # Act 2: KCM is stopped well before, nothing is marked, every endpoint stays, all comes back.
    assert m["cut_to_all_down_s"] < m["unprotected_first_unknown_s"] - 10
    # The aggregator's write of KCM's replicas, by its log: after the cut, before the poll saw it.
    assert 0 < m["cut_to_kcm_written_s"] <= m["cut_to_all_down_s"]
    assert m["nodes_unknown_max"] == 0 and m["endpoints_ready_min"] == 10
    text = out.getvalue()
    assert "controllers still carrying a record: 0" in text
    assert "the same cut, side by side: without protection KCM marked 10 nodes Unknown" in text
    # Its picture: both worlds, KCM at 0 marked where protection stopped it and nowhere else.
    svg = ET.parse(tmp_path / "race.svg").getroot()
    ns = {"svg": "http://www.w3.org/2000/svg"}
    marks = {
        g.get("data-world"): {line.get("data-mark") for line in g.iterfind("svg:line[@class='mark']", ns)}
        for g in svg.iterfind(".//svg:g[@class='world']", ns)
    }
    assert marks == {"no protection": {"cut", "heal"}, "protection": {"cut", "KCM at 0", "heal"}}
    assert f"the race as a picture: {(tmp_path / 'race.svg').resolve()}" in text
    shown_as_the_race(chromium.laid_out(tmp_path / "race.svg", tmp_path))


# How each chart's line lies once the race is run: level at the chart's top (all of them), level
# at its bottom (none), or spanning its height (it moved: renewals stop at the cut in both worlds).
ALL, NONE, MOVED = "all", "none", "moved"
RACE = {
    "no protection": {
        "leases renewed": MOVED,
        "KCM replicas": ALL,
        "nodes Unknown": MOVED,
        "ready endpoints": MOVED,
    },
    "protection": {
        "leases renewed": MOVED,
        "KCM replicas": MOVED,
        "nodes Unknown": NONE,
        "ready endpoints": ALL,
    },
}


def shown_as_the_race(shown: dict[str, Any]) -> None:
    """What a browser shows of the picture: two columns side by side, every text on the canvas,
    each chart's line from the axis' start to past the heal and lying as RACE says, the marks in
    order."""
    assert not shown["unseen"], f"texts off the canvas or not drawn: {shown['unseen']}"
    worlds = shown["worlds"]
    assert list(worlds) == list(RACE)
    assert worlds["no protection"]["box"]["right"] < worlds["protection"]["box"]["left"]
    for name, world in worlds.items():
        assert list(world["series"]) == list(RACE[name]), name
        for r, (series, box) in enumerate(world["series"].items()):
            top = picture.TOP + r * picture.ROW
            lies = {ALL: (top, top), NONE: (top + picture.CHART,) * 2, MOVED: (top, top + picture.CHART)}
            assert (box["top"], box["bottom"]) == lies[RACE[name][series]], (name, series, box)
        x = {mark: box["left"] for mark, box in world["marks"].items()}
        left = world["series"]["leases renewed"]["left"]
        assert left < x["cut"] < x.get("KCM at 0", x["cut"] + 1) < x["heal"] < left + picture.COLUMN, (
            name,
            x,
        )
        # Every line from the axis' start to past the heal (each world's last sample ends it).
        for series, box in world["series"].items():
            assert box["left"] == left and box["right"] > x["heal"], (name, series, box, x)
    assert "KCM at 0" in worlds["protection"]["marks"]
