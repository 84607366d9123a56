"""``make demo`` end to end: both acts on the same cut, real KCM processes, the aggregator's
real defaults. What its closing lines say is what this asserts."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from demo import scenario


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
