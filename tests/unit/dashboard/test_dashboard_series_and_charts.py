"""The dashboard's time series and SVG: steps, the cell's summed usage, n_r from r_S, and charts
a self-only Content-Security-Policy can show (no inline styles)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from cellpilot_services.dashboard import charts, models, series, trend_charts

GIB = 1 << 30
MIN = 60_000


@dataclass(frozen=True)
class Window:
    window_start_ms: int
    window_end_ms: int
    mean_total_usage: float


@dataclass(frozen=True)
class Horizontal:
    t_ms: int
    raw_task_count: float
    usage_statistic: float


def point(t: int, v: float) -> models.SeriesPoint:
    return models.SeriesPoint(t_ms=t, value=v)


@pytest.mark.parametrize(
    ("history", "current", "span", "expected"),
    [
        pytest.param([], 3, None, [(50, 3)], id="no-history-current-only"),
        pytest.param([point(10, 2)], 3, None, [(10, 2), (50, 3)], id="current-differs-appended"),
        pytest.param([point(10, 3)], 3, None, [(10, 3)], id="current-already-last"),
        pytest.param(
            [point(10, 2), point(40, 4)], 4, (20, 100), [(20, 2), (40, 4), (100, 4)], id="cut-to-span"
        ),
        pytest.param([point(30, 5)], 5, (0, 100), [(0, 5), (30, 5), (100, 5)], id="starts-before-history"),
    ],
)
def test_steps(
    history: list[models.SeriesPoint],
    current: float,
    span: tuple[int, int] | None,
    expected: list[tuple[int, float]],
) -> None:
    got = series.steps(history, current, 50, span)
    assert [(p.t_ms, p.value) for p in got] == expected


def test_cell_usage_sums_jobs_per_window_and_keeps_the_largest() -> None:
    per_job = {f"u/j{i}": [Window(t * MIN, (t + 1) * MIN, float(i + 1)) for t in range(3)] for i in range(4)}
    per_job["u/late"] = [Window(2 * MIN, 3 * MIN, 20.0)]  # started in the last window only
    total, by_job = series.cell_usage(per_job, hours=0, largest=2)
    assert [(p.t_ms, p.value) for p in total] == [(MIN, 10.0), (2 * MIN, 10.0), (3 * MIN, 30.0)]
    assert [s.name for s in by_job] == ["u/late", "u/j3", series.OTHER_JOBS]
    assert [p.value for p in by_job[0].points] == [0.0, 0.0, 20.0]
    assert [p.value for p in by_job[2].points] == [1.0 + 2.0 + 3.0] * 3
    # The bands add up to the total at every time.
    for i, p in enumerate(total):
        assert sum(s.points[i].value for s in by_job) == pytest.approx(p.value)


def test_cell_usage_keeps_the_last_hours_back_from_the_newest_window() -> None:
    hour = series.HOUR_MS
    windows = [Window(t * hour, (t + 1) * hour, 1.0) for t in range(5)]
    total, _ = series.cell_usage({"u/a": windows}, hours=2)
    assert [p.t_ms for p in total] == [4 * hour, 5 * hour]
    assert series.cell_usage({}, hours=2) == ([], [])


def test_raw_task_counts_follow_the_limit_in_force_and_prefer_a_published_raw_count() -> None:
    points = [
        Horizontal(10, 0.0, 1500.0),  # r_S 1.5 cores, limit 1 core, r* 0.5 -> 3 tasks
        Horizontal(30, 0.0, 1500.0),  # limit 2 cores from t=20 -> 2 tasks
        Horizontal(40, 7.0, 0.0),  # a target-size recommender's own n_r
        Horizontal(50, 0.0, 0.0),  # nothing to go on: no point
    ]
    got = series.raw_task_counts(points, 0.5, [(0, 1000), (20, 2000)])
    assert [(p.t_ms, p.value) for p in got] == [(10, 3.0), (30, 2.0), (40, 7.0)]
    assert [p.t_ms for p in series.raw_task_counts(points, 0.0, [(0, 1000)])] == [40]


def _usage() -> models.JobUsage:
    starts = [i * 5 * MIN for i in range(6)]
    return models.JobUsage(
        job_id="u/web",
        resource="memory",
        unit="bytes",
        heatmap=models.Heatmap(
            window_starts_ms=starts,
            window_ends_ms=[s + 5 * MIN for s in starts],
            bucket_edges=[0.0, GIB / 2, GIB, 2.0 * GIB],
            tasks=[[0.0] * 6, [2.0] * 6, [1.0] * 6],
        ),
        limit=[point(0, 2 * GIB), point(30 * MIN, 2 * GIB)],
        recommenders=[models.RecommenderLine(recommender="ml", points=[point(10 * MIN, 1.5 * GIB)])],
        selected_recommender="ml",
        mode="dry-run",
        ooms=[models.OomMarker(t_ms=20 * MIN, task_index=1, memory_bytes=GIB)],
    )


def _horizontal() -> models.HorizontalHistory:
    times = [i * 5 * MIN for i in range(1, 7)]
    return models.HorizontalHistory(
        job_id="u/web",
        mode="dry-run",
        target_utilization=0.6,
        cpu_limit_millicores=1000,
        task_count=[point(0, 2), point(30 * MIN, 2)],
        raw_recommendations=[models.RecommenderLine(recommender="auto", points=[point(t, 3) for t in times])],
        demand=[point(t, 1400.0) for t in times],
        demand_statistic=[point(t, 1500.0) for t in times],
        decision=models.HorizontalDecisionView(
            mode="dry-run",
            current_task_count=2,
            recommended_task_count=3,
            raw_task_count=2.5,
            stabiliser="limited-growth",
            usage_statistic=1500.0,
            decided_at_ms=times[-1],
            last_actuated_ms=0,
        ),
    )


def _utilisation() -> models.CellUtilisation:
    times = [i * 5 * MIN for i in range(1, 5)]
    resource = models.ResourceUtilisation(
        unit="millicores",
        capacity=8000,
        allocated=2400,
        used=[point(t, 1500.0) for t in times],
        by_job=[models.UsageSeries(name="u/web", points=[point(t, 1500.0) for t in times])],
    )
    return models.CellUtilisation(cpu=resource, memory=resource, jobs_counted=1)


@pytest.mark.parametrize(
    ("render", "ids"),
    [
        pytest.param(
            lambda: charts.job_chart(_usage()), ["usage-heatmap", "limit-line", "oom-markers"], id="job"
        ),
        pytest.param(
            lambda: trend_charts.horizontal_chart(_horizontal()),
            [
                "horizontal-task-count",
                "horizontal-raw-auto",
                "horizontal-decision",
                "horizontal-demand",
                "horizontal-statistic",
                "horizontal-target",
            ],
            id="horizontal",
        ),
        pytest.param(
            lambda: trend_charts.cell_utilisation_chart(_utilisation()),
            ["cell-used-cpu", "cell-used-cpu-0", "cell-capacity-memory", "cell-allocated-cpu"],
            id="cell-utilisation",
        ),
    ],
)
def test_charts_carry_their_ids_and_no_inline_styles(render: object, ids: list[str]) -> None:
    svg = render()  # type: ignore[operator]
    assert svg.startswith("<svg")
    for ident in ids:
        assert f'id="{ident}"' in svg, ident
    assert " style=" not in svg
    assert "<style" not in svg
    assert "<metadata" not in svg
    assert re.search(r'<path [^>]*fill="#', svg)  # the colours survived as attributes
    assert svg == render()  # type: ignore[operator]  # the same data draws the same SVG


def test_presentation_attributes_keep_every_declaration() -> None:
    style = "fill: none; stroke: #1f77b4; stroke-width: 1.5; stroke-dasharray: 5.55,2.4"
    text = (
        '<svg width="1"><defs><style type="text/css">*{stroke-linejoin: round}</style></defs>'
        f'<path d="M0 0" style="{style}"/></svg>'
    )
    got = charts.presentation_attributes(text)
    assert (
        '<path d="M0 0" fill="none" stroke="#1f77b4" stroke-width="1.5" stroke-dasharray="5.55,2.4"/>' in got
    )
    assert got.startswith('<svg stroke-linejoin="round" stroke-linecap="butt" width="1">')
