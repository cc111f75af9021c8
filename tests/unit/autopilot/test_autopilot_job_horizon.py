"""Each job's own §3.3 horizon T and statistic S for r_S in the recommender worker's state
(cellpilot.autopilot.job_recommendations): r_S forgets a peak once it is older than T."""

from __future__ import annotations

import numpy as np

from cellpilot.autopilot.job_recommendations import (
    HistogramInput,
    HorizontalSettings,
    RecommenderConfig,
    RecommenderState,
    apply_histograms,
    apply_horizontal_settings,
)
from cellpilot.job_vocabulary import HorizontalStatistic
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource

W = 300_000
CONFIG = RecommenderConfig()


def _window(job: str, k: int, total_millicores: float) -> list[HistogramInput]:
    out = []
    for resource, level in ((Resource.CPU, 1000.0), (Resource.MEMORY, GIB)):  # 1 core, 1 GiB
        scheme = CONFIG.for_resource(resource).scheme
        counts = np.zeros(scheme.size)
        counts[int(scheme.index_of(level))] = 300.0
        usage = total_millicores if resource is Resource.CPU else level
        out.append(HistogramInput(job, resource, (k + 1) * W, counts, usage))
    return out


def test_r_s_is_taken_over_each_jobs_own_horizon() -> None:
    states: dict[str, RecommenderState] = {}
    changed = apply_horizontal_settings(
        CONFIG, states, {"short": HorizontalSettings(2 * W, HorizontalStatistic.MAX)}
    )
    assert changed == {"short"}
    # A peak of 6 cores, then 2 cores: the short horizon forgets the peak two windows later;
    # the default (72 h) keeps it.
    levels = [6000.0, 2000.0, 2000.0, 2000.0]
    seen = {"short": [], "default": []}
    for k, level in enumerate(levels):
        apply_histograms(CONFIG, states, [*_window("short", k, level), *_window("default", k, level)])
        for job in seen:
            seen[job].append(states[job].usage_statistic)
    assert seen["short"] == [6000.0, 6000.0, 2000.0, 2000.0]
    assert seen["default"] == [6000.0, 6000.0, 6000.0, 6000.0]


def test_the_settings_survive_a_checkpoint_and_setting_them_again_changes_nothing() -> None:
    states: dict[str, RecommenderState] = {}
    settings = {"j": HorizontalSettings(600_000, HorizontalStatistic.P95)}
    apply_horizontal_settings(CONFIG, states, settings)
    restored = RecommenderState.from_bytes(states["j"].to_bytes())
    assert restored.horizon == settings["j"]
    assert apply_horizontal_settings(CONFIG, {"j": restored}, settings) == set()
