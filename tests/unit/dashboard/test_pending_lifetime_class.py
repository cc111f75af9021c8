"""The pending page shows each waiting job's LAVA lifetime class (LAVA §4.3) next to why it waits."""

from __future__ import annotations

import pytest

from cellpilot_services.dashboard import models
from cellpilot_services.dashboard.page_layout import Viewer
from cellpilot_services.dashboard.pages import pending_page


def _job(lifetime_class: str) -> models.PendingJob:
    return models.PendingJob(
        job_id="alice/batch",
        state="pending",
        pending_tasks=2,
        task_index=0,
        summary="no machine has 4 cores free",
        machines_feasible=0,
        machines_total=3,
        fitting_limits=None,
        lifetime_class=lifetime_class,
    )


@pytest.mark.parametrize(
    ("lifetime_class", "shown"),
    [("LC2 (1-10 h)", "<td>LC2 (1-10 h)</td>"), ("", "<td>-</td>")],
    ids=["predicted", "no-model"],
)
def test_the_pending_page_has_a_lifetime_class_column(lifetime_class: str, shown: str) -> None:
    page = pending_page(models.PendingView(jobs=[_job(lifetime_class)]), Viewer("alice"), 5.0)
    assert "<th>lifetime class</th>" in page
    assert shown in page
