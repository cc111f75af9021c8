"""The optional CPU decorator for jobs whose demand went unserved (cellpilot.recommend.unmet_demand),
alone and wired into the recommender worker's per-job state (off by default)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cellpilot.autopilot.job_recommendations import HistogramInput, RecommenderConfig, apply_histograms
from cellpilot.recommend.unmet_demand import RaiseForUnmetDemand
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource

W = 300_000


@pytest.mark.parametrize(
    ("usage", "unmet", "factor"),
    [
        (1.0, 0.0, 1.0),  # nothing unserved
        (1.0, 0.01, 1.0),  # 1 % unserved: below the 2 % threshold
        (1.0, 0.5, 1.5),  # demand 1.5 x what was used
        (1.0, 3.0, 2.0),  # capped at max_factor
        (0.0, 0.5, 2.0),  # nothing served at all: the cap
    ],
    ids=["none", "below-threshold", "scaled", "capped", "starved"],
)
def test_the_factor_is_demand_over_served_usage_within_bounds(
    usage: float, unmet: float, factor: float
) -> None:
    assert RaiseForUnmetDemand().factor([usage], [unmet]).tolist() == [pytest.approx(factor)]


def test_apply_scales_every_recommender_column_of_a_raised_job_only() -> None:
    values = np.array([[1.0, 2.0], [1.0, 2.0]])
    scaled, raised = RaiseForUnmetDemand().apply(values, [1.0, 1.0], [0.25, 0.0])
    np.testing.assert_allclose(scaled, [[1.25, 2.5], [1.0, 2.0]])
    assert raised.tolist() == [True, False]


def _windows(job: str, k: int, unmet: float) -> list[HistogramInput]:
    out = []
    for resource, level in ((Resource.CPU, 1000.0), (Resource.MEMORY, GIB)):  # 1 core, 1 GiB
        scheme = RecommenderConfig().for_resource(resource).scheme
        counts = np.zeros(scheme.size)
        counts[int(scheme.index_of(level))] = 300.0
        cpu_unmet = unmet if resource is Resource.CPU else 0.0
        out.append(HistogramInput(job, resource, (k + 1) * W, counts, level * 2, cpu_unmet))
    return out


def test_a_throttled_job_gets_more_cpu_only_with_the_option_on() -> None:
    off, on = RecommenderConfig(), replace(RecommenderConfig(), unmet_demand=RaiseForUnmetDemand())
    inputs = [w for k in range(4) for w in _windows("j", k, unmet=1000.0 if k == 3 else 0.0)]
    results = {}
    for name, config in (("off", off), ("on", on)):
        states: dict = {}
        apply_histograms(config, states, inputs)
        results[name] = states["j"].rows[Resource.CPU].value
    # Two tasks used 2 cores and wanted 3: every CPU recommender's value is 1.5 x higher.
    np.testing.assert_allclose(results["on"], results["off"] * 1.5)
    # Memory recommendations never change.
    states_off: dict = {}
    states_on: dict = {}
    apply_histograms(off, states_off, inputs)
    apply_histograms(on, states_on, inputs)
    np.testing.assert_array_equal(
        states_off["j"].rows[Resource.MEMORY].value, states_on["j"].rows[Resource.MEMORY].value
    )
