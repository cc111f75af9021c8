"""What a horizontal-scaling replay is judged by, computed from its per-sample series.

A replay (:mod:`cellpilot.evaluate.horizontal_study`) samples the world every ``sample_s``
seconds; sample j stands for ``[seconds[j], seconds[j] + sample_s)``. From the series:

* task-hours: running tasks (ready or still starting) x time, what the job pays for;
* minutes overloaded: time during which the job's demand exceeded what its tasks could serve
  (some demand unmet: beyond the ready tasks' capacity, or no ready task at all);
* unmet CPU-seconds: the unserved demand, integrated (core-seconds);
* task-count changes per day: decisions that changed the count;
* mean utilisation: served CPU over the ready tasks' limits;
* time to follow a step: from a step in demand to the first sample at which the ready tasks'
  capacity covers the new level (``None`` when it never does).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

UNMET_EPSILON_MILLICORES = 1e-3  # below this, rounding, not overload


def series_metrics(
    seconds: npt.ArrayLike,
    sample_s: float,
    running: npt.ArrayLike,
    ready: npt.ArrayLike,
    served_millicores: npt.ArrayLike,
    unmet_millicores: npt.ArrayLike,
    task_cpu_limit: float,
    changes: int,
    step_at_s: float | None = None,
    step_level_millicores: float | None = None,
    task_capacity_millicores: float | None = None,
) -> dict[str, Any]:
    """The metrics of one replay; ``task_capacity_millicores`` is what one ready task can serve
    (default its limit; more when it may burst into its machine's spare CPU)."""
    t = np.asarray(seconds, dtype=np.float64)
    n_running = np.asarray(running, dtype=np.float64)
    n_ready = np.asarray(ready, dtype=np.float64)
    served = np.asarray(served_millicores, dtype=np.float64)
    unmet = np.asarray(unmet_millicores, dtype=np.float64)
    if not t.shape == n_running.shape == n_ready.shape == served.shape == unmet.shape:
        raise ValueError("every series needs one value per sample")
    if sample_s <= 0 or task_cpu_limit <= 0:
        raise ValueError("sample length and task CPU limit must be positive")
    days = t.shape[0] * sample_s / 86_400.0
    capacity_per_task = task_capacity_millicores or task_cpu_limit
    limits = float(np.sum(n_ready)) * task_cpu_limit
    follow: float | None = None
    if step_at_s is not None and step_level_millicores is not None:
        covered = np.flatnonzero((t >= step_at_s) & (n_ready * capacity_per_task >= step_level_millicores))
        follow = float(t[covered[0]] - step_at_s) if covered.size else None
    return {
        "task_hours": float(np.sum(n_running)) * sample_s / 3600.0,
        "overloaded_minutes": float(np.sum(unmet > UNMET_EPSILON_MILLICORES)) * sample_s / 60.0,
        "unmet_cpu_seconds": float(np.sum(unmet)) * sample_s / 1000.0,
        "changes_per_day": changes / days if days > 0 else 0.0,
        "mean_utilisation": float(np.sum(served)) / limits if limits > 0 else 0.0,
        "time_to_follow_s": follow,
    }
