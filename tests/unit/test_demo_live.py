"""The demo on a terminal (demo/live.py): the board drawn from a state of both worlds; off a
terminal, the line per sample that tests/integration/test_demo.py and the docs read."""

from __future__ import annotations

import dataclasses
import io

from demo import live, scenario
from demo.track import Track, status_line
from tests.unit import demo_timeline as race


def at(track: Track, now: float) -> Track:
    """The track as it stood at ``now``: what was sampled and marked by then."""
    return dataclasses.replace(
        track,
        marks={k: v for k, v in track.marks.items() if v <= now},
        samples=[s for s in track.samples if s.at <= now],
    )


def test_the_board_forty_seconds_after_the_cut() -> None:
    now = race.CUT + 40
    lines = live.board([at(race.unprotected(), now), at(race.protected(), now)], now, 80)
    assert lines == [
        "                  no protection                  protection",
        "                  cut +40s                       cut +40s",
        "leases renewed    ██▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁  0/10    ██▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁  0/10",
        "KCM replicas      █████████████████████     3    █████▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁     0",
        "nodes Unknown     ▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▂▄▅▇  8/10    ▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁  0/10",
        "ready endpoints   █████████████████▇▅▄▂  2/10    █████████████████████ 10/10",
    ]


def test_the_board_fits_a_narrow_terminal_and_says_when_the_cut_healed() -> None:
    now = race.CUT + 100
    lines = live.board([race.unprotected(), race.protected()], now, 60)
    assert all(len(line) <= 60 for line in lines)
    assert lines[1].split() == ["cut", "+100s", "heal", "+50s", "cut", "+100s", "heal", "+50s"]
    before = live.board([at(race.unprotected(), race.CUT - 1)], race.CUT - 1, 80)
    assert before[1].strip() == "before the cut"


def test_a_sparkline_is_blank_before_the_first_sample() -> None:
    samples = race.protected().samples[:3]  # 30, 29.5 and 29 s before the cut
    line = live.sparkline(samples, lambda s: s.kcm, 3, samples[-1].at, 4)
    assert line == "   █"


def test_off_a_terminal_a_sample_is_a_line_when_it_changed() -> None:
    out = io.StringIO()
    show = scenario.Show(out, scenario.Timeline(start=0.0), "protection")
    samples = race.protected().samples
    for s in samples[:3]:
        show.sample(s)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "protection    | leases renewed in the last 4s: 10/10   KCM 3 (3 running)  MCM 2  CA 1   "
        "nodes Ready 10/10, Unknown 0   ready endpoints 10/10"
    )
    assert status_line(samples[-1]).startswith("leases renewed in the last 4s: 10/10   KCM 3 (3 running)")
    assert len(show.track.samples) == 3  # every sample kept for the picture


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_board_is_redrawn_over_itself() -> None:
    out = Terminal()
    shows = scenario._shows(out, 0.0, ["no protection", "protection"], None)
    assert all(s.live is shows[0].live is not None for s in shows)
    assert scenario._shows(io.StringIO(), 0.0, ["protection"], None)[0].live is None
    for s in race.protected().samples[:3]:
        shows[1].sample(s)
    shows[0]("starting the shoot's kube-apiserver")
    text = out.getvalue()
    assert "leases renewed in the last 4s" not in text  # the board instead of the lines
    drawn = text.split("\x1b[J")
    assert len(drawn) == 2  # drawn once, then once more over itself, the line said above it
    assert drawn[1].startswith("[") and "no protection | starting the shoot's kube-apiserver\n" in drawn[1]
    assert drawn[0].count("\n") == int(drawn[0].rsplit("\x1b[", 1)[1].removesuffix("A"))
