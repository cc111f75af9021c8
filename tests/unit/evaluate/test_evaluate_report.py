"""The shared report writer: summary.json, markdown tables, PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cellpilot.evaluate.report import markdown_table, plot_bars, plot_scatter, write_markdown, write_summary


def test_summary_json_converts_numpy_and_non_finite_values(tmp_path: Path) -> None:
    path = write_summary(
        tmp_path / "nested",
        {"a": np.float64(1.5), "b": np.arange(3), "c": (1, 2), "d": float("nan"), "e": {1: np.int64(2)}},
    )
    assert json.loads(path.read_text()) == {"a": 1.5, "b": [0, 1, 2], "c": [1, 2], "d": None, "e": {"1": 2}}


def test_markdown_table_formats_columns() -> None:
    rows = [{"name": "x", "value": 0.123456, "share": 0.5}, {"name": "y", "value": None}]
    text = markdown_table(rows, ["name", "value", "share"], {"share": ".0%"}, {"value": "v"})
    assert text.splitlines() == [
        "| name | v | share |",
        "|---|---|---|",
        "| x | 0.1235 | 50% |",
        "| y | – | – |",
    ]


def test_markdown_file_and_plots(tmp_path: Path) -> None:
    md = write_markdown(tmp_path, "r.md", "Title", ["one", "two\n"])
    assert md.read_text() == "# Title\n\none\n\ntwo\n"  # sections are separate paragraphs
    scatter = plot_scatter(tmp_path / "s.png", {"a": ([1, 2], [0.1, 0.0])}, "x", "y", "t", log_y=True)
    bars = plot_bars(tmp_path / "b.png", ["p", "q"], [3.0, 4.0], "y", "t", low=[2.0, 4.0], high=[3.0, 5.0])
    for path in (scatter, bars):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
