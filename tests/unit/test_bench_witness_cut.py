from __future__ import annotations

from bench.witness_cut import Cut, rows, summary


def test_summary_is_median_min_max() -> None:
    assert summary([12.0, 11.0, 14.0, 13.0]) == (12.5, 11.0, 14.0)


def test_rows_give_each_tree_and_the_difference_of_medians() -> None:
    table = rows(
        {
            "today": [Cut(12.4, 13.0), Cut(12.0, 13.5), Cut(13.1, 13.2)],
            "before": [Cut(11.9, 12.9), Cut(12.2, 13.0), Cut(12.1, 14.0)],
        }
    )
    assert table == [
        ["today", "3", "12.40", "12.00", "13.10", "13.20", "13.00", "13.50"],
        ["before", "3", "12.10", "11.90", "12.20", "13.00", "12.90", "14.00"],
        ["today - before", "", "+0.30", "", "", "+0.20", "", ""],
    ]
