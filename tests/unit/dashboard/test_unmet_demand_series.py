"""The job page's CPU chart shows unmet demand per task when there is some (services/dashboard)."""

from __future__ import annotations

from cellpilot_services.dashboard import models
from cellpilot_services.dashboard.charts import job_chart


def _usage(unmet: list[models.SeriesPoint]) -> models.JobUsage:
    return models.JobUsage(
        job_id="u/web",
        resource="cpu",
        unit="millicores",
        heatmap=None,
        limit=[models.SeriesPoint(t_ms=1_700_000_000_000, value=1000.0)],
        recommenders=[],
        selected_recommender="",
        mode="off",
        ooms=[],
        unmet=unmet,
    )


def test_the_cpu_chart_draws_unmet_demand_only_when_there_is_some() -> None:
    points = [models.SeriesPoint(t_ms=1_700_000_000_000 + i * 300_000, value=250.0 * i) for i in range(4)]
    assert 'id="unmet-demand"' in job_chart(_usage(points))
    assert "unmet-demand" not in job_chart(_usage([]))
