"""Server-side SVG charts (matplotlib, no JavaScript, nothing fetched from a CDN).

The job chart is Autopilot §5.2 / Figure 9: a heatmap of how many tasks use how much of a
resource in each 5-minute window, the limit as a step line, every recommender's output as a
line, OOM kills as markers, and (CPU) the demand per task its machines did not serve as a
dotted line. Elements carry ids (``usage-heatmap``, ``limit-line``, ``recommender-<name>``,
``oom-markers``, ``unmet-demand``) so tests and scripts can find them in the SVG.

The horizontal chart (Autopilot §3.3) and the cell's utilisation over time live in
:mod:`cellpilot_services.dashboard.trend_charts`.

The SVG is inlined into pages served with a Content-Security-Policy that allows no inline
styles, so :func:`svg` turns matplotlib's ``style`` attributes into the equivalent SVG
presentation attributes and drops its stylesheet (see :func:`presentation_attributes`).
"""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime

import matplotlib
import numpy as np
import numpy.typing as npt
from matplotlib import dates as mdates  # the Figure API below needs no pyplot and no GUI backend
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from cellpilot.units import GIB, MILLICORES_PER_CORE
from cellpilot_services.dashboard import models

# Ids of clip paths are hashes salted with this (a random salt by default), so that the same
# data draws the same SVG and a refreshing page swaps only the charts that changed.
matplotlib.rcParams["svg.hashsalt"] = "cellpilot-dashboard"

ROWS = 240  # vertical resolution of the heatmap raster
RECOMMENDER_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e")


def time_number(ms: int) -> float:
    """Event time as a matplotlib date number."""
    return float(mdates.date2num(datetime.fromtimestamp(ms / 1000, tz=UTC)))


def scale_of(resource: str) -> tuple[float, str]:
    return (float(MILLICORES_PER_CORE), "CPU (cores)") if resource == "cpu" else (float(GIB), "memory (GiB)")


def _highest_used(grid: models.Heatmap) -> float:
    """The upper edge of the highest bucket any task used (the heatmap's top)."""
    used = [b for b, row in enumerate(grid.tasks) if any(row)]
    return grid.bucket_edges[min(used[-1] + 1, len(grid.bucket_edges) - 1)] if used else 1.0


def _resample(grid: models.Heatmap, top: float) -> tuple[npt.NDArray[np.float64], int, int]:
    """The bucket x window counts on a uniform raster: ROWS rows from 0 to ``top`` and one column
    per window slot from the first window's start to the last one's end (missing windows empty).

    Buckets narrower than a row add up in the row holding their centre; a row holding no
    bucket centre shows the bucket it lies in, so wide buckets appear as bands."""
    starts = np.asarray(grid.window_starts_ms, dtype=np.int64)
    ends = np.asarray(grid.window_ends_ms, dtype=np.int64)
    width = max(int(np.min(ends - starts)), 1)
    x0, x1 = int(starts[0]), int(ends[-1])
    columns = np.clip((starts - x0) // width, 0, None).astype(np.int64)
    slots = int(max(columns[-1] + 1, (x1 - x0) // width))
    edges = np.asarray(grid.bucket_edges, dtype=np.float64)
    counts = np.asarray(grid.tasks, dtype=np.float64)  # buckets x windows
    rows = np.zeros((ROWS, slots))
    centres = (edges[:-1] + edges[1:]) / 2
    inside = centres < top
    row_of_bucket = np.minimum((centres[inside] / top * ROWS).astype(np.int64), ROWS - 1)
    for bucket_row, bucket_counts in zip(row_of_bucket, counts[inside], strict=True):
        rows[bucket_row, columns] += bucket_counts
    empty = ~rows.any(axis=1)
    row_centres = (np.arange(ROWS) + 0.5) / ROWS * top
    containing = np.clip(np.searchsorted(edges, row_centres, side="right") - 1, 0, len(counts) - 1)
    for row in np.flatnonzero(empty):
        rows[row, columns] = counts[containing[row]]
    return rows, x0, x0 + slots * width


def date_axis(figure: Figure, axes: Axes) -> None:
    """Event time along the x axis, as month-day hours:minutes."""
    axes.xaxis_date()
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    figure.autofmt_xdate()


STYLE_ATTRIBUTE = re.compile(r' style="([^"]*)"')
STYLE_ELEMENT = re.compile(r"<style[^>]*>(.*?)</style>", re.DOTALL)
METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)
ROOT_DEFAULTS = ' stroke-linejoin="round" stroke-linecap="butt"'  # matplotlib's stylesheet, as attributes


def _as_attributes(match: re.Match[str]) -> str:
    declarations = (part.split(":", 1) for part in match.group(1).split(";") if ":" in part)
    return "".join(f' {name.strip()}="{value.strip()}"' for name, value in declarations)


def presentation_attributes(text: str) -> str:
    """``style="fill: #fff; stroke-width: 0.8"`` -> ``fill="#fff" stroke-width="0.8"``.

    Every property matplotlib writes (fill, stroke and their widths, caps, joins, dashes,
    opacities) is also an SVG presentation attribute, so the drawing is unchanged while the
    page's Content-Security-Policy can refuse inline styles. Its one stylesheet (round joins,
    butt caps) becomes attributes of the root element, which its children inherit; the
    metadata (a timestamp) goes, so the same data renders to the same SVG."""
    text = METADATA.sub("", STYLE_ELEMENT.sub("", text))
    text = text.replace("<svg ", f"<svg{ROOT_DEFAULTS} ", 1)
    return STYLE_ATTRIBUTE.sub(_as_attributes, text)


def svg(figure: Figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return presentation_attributes(text[text.index("<svg") :])  # inline-able: no XML prolog or doctype


def job_chart(usage: models.JobUsage) -> str:
    """The job page's chart for one resource, as an inline SVG document."""
    scale, label = scale_of(usage.resource)
    figure = Figure(figsize=(10, 4.2))
    axes = figure.add_subplot()
    top = 0.0
    grid = usage.heatmap
    if grid is not None and grid.window_starts_ms:
        top = _highest_used(grid) / scale
        image, x0, x1 = _resample(grid, top * scale)
        heat = axes.imshow(
            np.ma.masked_equal(image, 0.0),
            extent=(time_number(x0), time_number(x1), 0.0, top),
            origin="lower",
            aspect="auto",
            cmap="YlOrRd",
            interpolation="nearest",
            vmin=0.0,
        )
        heat.set_gid("usage-heatmap")
        colourbar = figure.colorbar(heat, ax=axes, pad=0.01)
        colourbar.set_label("tasks")
    else:
        axes.text(0.5, 0.5, "no usage history yet", transform=axes.transAxes, ha="center", color="grey")
    if usage.limit:
        xs = [time_number(p.t_ms) for p in usage.limit]
        ys = [p.value / scale for p in usage.limit]
        (line,) = axes.step(xs, ys, where="post", color="black", linewidth=2.2, label="limit")
        line.set_gid("limit-line")
        top = max(top, *ys)
    for i, rec in enumerate(usage.recommenders):
        xs = [time_number(p.t_ms) for p in rec.points]
        ys = [p.value / scale for p in rec.points]
        selected = rec.recommender == usage.selected_recommender
        (line,) = axes.plot(
            xs,
            ys,
            color=RECOMMENDER_COLOURS[i % len(RECOMMENDER_COLOURS)],
            linewidth=2.0 if selected else 1.2,
            linestyle="-" if selected else "--",
            marker="o" if len(xs) == 1 else None,
            label=f"{rec.recommender}{' (selected)' if selected else ''}",
        )
        line.set_gid(f"recommender-{rec.recommender}")
        top = max(top, *ys) if ys else top
    if usage.unmet:
        xs = [time_number(p.t_ms) for p in usage.unmet]
        ys = [p.value / scale for p in usage.unmet]
        (line,) = axes.plot(
            xs, ys, color="purple", linewidth=1.4, linestyle=":", label="unmet demand per task"
        )
        line.set_gid("unmet-demand")
        top = max(top, *ys)
    if usage.ooms:
        xs = [time_number(o.t_ms) for o in usage.ooms]
        ys = [o.memory_bytes / scale for o in usage.ooms]
        marks = axes.scatter(xs, ys, marker="X", s=60, color="red", zorder=5, label="OOM kill")
        marks.set_gid("oom-markers")
        top = max(top, *ys)
    axes.set_ylim(0, top * 1.1 if top > 0 else 1)
    axes.set_ylabel(label)
    axes.set_title(f"{usage.job_id}: {usage.resource} (Autopilot {usage.mode})")
    date_axis(figure, axes)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper left", fontsize="small", framealpha=0.8)
    return svg(figure)


def cell_chart(cell: models.CellView) -> str:
    """Per machine: usage, reservation and allocation as shares of capacity (Borg §5.5)."""
    figure = Figure(figsize=(10, 4.5))
    machines = sorted(cell.machines, key=lambda m: m.machine_id)
    names = [m.machine_id for m in machines]
    for row, dim in enumerate(("cpu_millicores", "memory_bytes")):
        axes = figure.add_subplot(2, 1, row + 1)
        width = 0.27
        for offset, (key, colour) in enumerate(
            (("usage", "#2ca02c"), ("reserved", "#ff7f0e"), ("allocated", "#1f77b4"))
        ):
            shares = [
                100.0 * getattr(m, key)[dim] / m.capacity[dim] if m.capacity[dim] else 0.0 for m in machines
            ]
            bars = axes.bar(
                [i + (offset - 1) * width for i in range(len(machines))],
                shares,
                width,
                label=key,
                color=colour,
            )
            for i, patch in enumerate(bars.patches):
                patch.set_gid(f"cell-{key}-{dim.split('_')[0]}-{i}")
        axes.set_ylabel(f"{'CPU' if row == 0 else 'memory'} % of capacity")
        axes.set_ylim(0, 110)
        axes.set_xticks(
            range(len(machines)), names if row == 1 else [""] * len(names), rotation=45, fontsize=7
        )
        if row == 0:
            axes.legend(loc="upper right", fontsize="small", ncols=3)
    figure.suptitle("utilisation vs reservation vs allocation")
    return svg(figure)
