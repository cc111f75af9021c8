"""Writing a study's results: ``summary.json``, a markdown table and PNG plots.

Every study in :mod:`cellpilot.evaluate` returns plain data; this module is the one
place that turns it into files (matplotlib with the Agg backend, no display needed).
It is generic: rows are mappings, columns are chosen by the caller.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _plain(value: Any) -> Any:
    """JSON-safe copies of numpy scalars/arrays, tuples and non-finite floats."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return _plain(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_summary(out_dir: Path, summary: Mapping[str, Any], name: str = "summary.json") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(json.dumps(_plain(summary), indent=2, sort_keys=True) + "\n")
    return path


def format_cell(value: Any, fmt: str | None = None) -> str:
    if value is None:
        return "–"
    if fmt is not None and isinstance(value, int | float):
        return format(value, fmt)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    formats: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    formats = formats or {}
    headers = headers or {}
    head = "| " + " | ".join(headers.get(c, c) for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = [
        "| " + " | ".join(format_cell(row.get(c), formats.get(c)) for c in columns) + " |" for row in rows
    ]
    return "\n".join([head, rule, *body]) + "\n"


def write_markdown(out_dir: Path, name: str, title: str, sections: Sequence[str]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(f"# {title}\n\n" + "\n".join(s.rstrip() + "\n" for s in sections))
    return path


def save_figure(fig: Figure, path: Path, dpi: int = 120) -> Path:
    """``fig`` as a PNG at ``path`` (its directory made if need be), through the Agg backend."""
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def plot_scatter(
    path: Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    xlabel: str,
    ylabel: str,
    title: str,
    log_y: bool = False,
    lines: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
    linear_below: float = 1e-6,
    colormap: str = "tab20",
) -> Path:
    """One marker series per label, e.g. (machines, overflow frequency) per method; ``lines``
    adds labelled lines through points (e.g. a frontier). ``log_y``: a symmetric-log y axis,
    linear below ``linear_below`` (so zeros show)."""
    fig = Figure(figsize=(7, 5))
    ax = fig.add_subplot()
    palette = colormaps[colormap]
    colours = getattr(palette, "N", 20)
    markers = "os^Dv"
    for i, (label, (xs, ys)) in enumerate(series.items()):
        ax.scatter(
            list(xs),
            list(ys),
            label=label,
            s=16,
            color=palette(i % colours),
            marker=markers[(i // colours) % 5],
        )
    for label, (xs, ys) in (lines or {}).items():
        ax.plot(list(xs), list(ys), label=label, color="black", linewidth=1.0, drawstyle="steps-post")
    if log_y:
        ax.set_yscale("symlog", linthresh=linear_below)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def plot_bars(
    path: Path,
    labels: Sequence[str],
    values: Sequence[float],
    ylabel: str,
    title: str,
    low: Sequence[float] | None = None,
    high: Sequence[float] | None = None,
) -> Path:
    """Bars with optional [low, high] error bars (e.g. min/max over seeds)."""
    fig = Figure(figsize=(max(4.0, 0.6 * len(labels) + 2), 4.5))
    ax = fig.add_subplot()
    positions = list(range(len(labels)))
    yerr = None
    if low is not None and high is not None:
        yerr = [
            [v - lo for v, lo in zip(values, low, strict=True)],
            [hi - v for v, hi in zip(values, high, strict=True)],
        ]
    ax.bar(positions, list(values), yerr=yerr, capsize=4, color="#4c72b0")
    ax.set_xticks(positions, list(labels), rotation=45, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def plot_line_panels(
    path: Path,
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    xlabel: str,
    ylabel: str,
    title: str,
    columns: int = 2,
) -> Path:
    """Small multiples sharing their axes: one panel per title, one line per label within it
    (the same label gets the same colour in every panel), e.g. task count against demand over
    time per decider."""
    rows = max(1, -(-len(panels) // columns))
    fig = Figure(figsize=(6.0 * columns, 2.6 * rows + 0.6))
    axes = fig.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    palette = colormaps["tab10"]
    colours: dict[str, Any] = {}
    for ax, (panel, lines) in zip(axes.flat, panels.items(), strict=False):
        for label, (xs, ys) in lines.items():
            colour = colours.setdefault(label, palette(len(colours) % 10))
            ax.plot(list(xs), list(ys), label=label, color=colour, linewidth=0.9, drawstyle="steps-post")
        ax.set_title(panel, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    axes.flat[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title)
    return save_figure(fig, path)
