"""CPU in millicores gives the recommendations CPU in cores gave, times 1000 (cellpilot.units).

The cores set-up is what the recommenders ran before the change: the legacy cores scheme, the
margin curve's breakpoints at 1 and 64 cores, the ML ensemble's additive margins in units of
one core. The same counts (bucket k of the legacy scheme is bucket k of the millicore one) must
give every recommender's value x 1000, the same relative margins and the same ML model; and a
worker's state saved in cores (recommender state format 1) must read as the state built in millicores.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cellpilot.autopilot import array_bundle
from cellpilot.autopilot.candidates import CandidateConfig, initial_candidate_state, update_candidates
from cellpilot.autopilot.job_recommendations import (
    HistogramInput,
    RecommenderConfig,
    RecommenderState,
    apply_histograms,
)
from cellpilot.autopilot.ml_config import load_ml_config
from cellpilot.recommend.ml_ensemble import EnsembleConfig
from cellpilot.recommend.post_processing import MarginCurve
from cellpilot.usage.buckets import CPU_SCHEME, MEMORY_SCHEME, Resource, geometric_scheme

LEGACY_CPU = geometric_scheme(
    "cpu-cores-geometric", 1, Resource.CPU, "cores", lowest=1e-3, highest=512.0, buckets=400
)
WINDOW_MS = 300_000


def in_cores(config: CandidateConfig) -> CandidateConfig:
    """The same recommenders with CPU in cores, as they ran before CPU became millicores."""
    return replace(
        config,
        scheme=LEGACY_CPU,
        margin=MarginCurve(small_limit=1.0, large_limit=64.0),
        ensemble=replace(config.ensemble, grid=config.ensemble.grid.with_unit(1.0)),
    )


def job_histograms(windows: int, jobs: int, seed: int) -> np.ndarray:
    """(windows, jobs, K) counts: per job a diurnal level in cores, drawn in the legacy buckets."""
    rng = np.random.default_rng(seed)
    level = rng.lognormal(np.log(0.5), 1.0, size=jobs)
    out = np.zeros((windows, jobs, CPU_SCHEME.size))
    for t in range(windows):
        wave = 1.0 + 0.5 * np.sin(2 * np.pi * t / 288.0)
        for j in range(jobs):
            values = level[j] * wave * rng.lognormal(0.0, 0.3, size=60)
            out[t, j] = np.bincount(LEGACY_CPU.index_of(values), minlength=LEGACY_CPU.size)
    return out


@pytest.mark.parametrize("ensemble", [EnsembleConfig(), load_ml_config()], ids=["defaults", "tuned"])
def test_every_recommender_gives_1000_times_its_cores_value(ensemble: EnsembleConfig) -> None:
    millicores = CandidateConfig.for_resource(Resource.CPU, ensemble)
    cores = in_cores(millicores)
    jobs = 6
    state_mc, state_c = initial_candidate_state(millicores, jobs), initial_candidate_state(cores, jobs)
    for t, counts in enumerate(job_histograms(150, jobs, seed=5)):
        end = np.full(jobs, (t + 1) * WINDOW_MS, dtype=np.int64)
        state_mc, out_mc = update_candidates(millicores, state_mc, counts, end)
        state_c, out_c = update_candidates(cores, state_c, counts, end)
        np.testing.assert_allclose(out_mc.value, out_c.value * 1000.0, rtol=1e-9)
        np.testing.assert_allclose(out_mc.raw_value, out_c.raw_value * 1000.0, rtol=1e-9)
        np.testing.assert_allclose(out_mc.margin, out_c.margin, rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(out_mc.raised_by_window_max, out_c.raised_by_window_max)
        np.testing.assert_array_equal(out_mc.ml_model, out_c.ml_model)
        np.testing.assert_allclose(out_mc.ml_cost, out_c.ml_cost, rtol=1e-9)


def test_a_job_state_saved_in_cores_reads_as_the_state_built_in_millicores() -> None:
    millicores = RecommenderConfig()
    cores = replace(millicores, cpu=in_cores(millicores.cpu))
    states_mc: dict[str, RecommenderState] = {}
    states_c: dict[str, RecommenderState] = {}
    memory = np.bincount(MEMORY_SCHEME.index_of([2.0**30]), minlength=MEMORY_SCHEME.size).astype(float)
    for t, counts in enumerate(job_histograms(40, 1, seed=9)):
        end = (t + 1) * WINDOW_MS
        usage_cores = 0.4 + 0.01 * t
        for config, states, scale in ((millicores, states_mc, 1000.0), (cores, states_c, 1.0)):
            apply_histograms(
                config,
                states,
                [
                    HistogramInput("j", Resource.CPU, end, counts[0], usage_cores * scale, 0.0),
                    HistogramInput("j", Resource.MEMORY, end, memory, 2.0**30),
                ],
            )
    arrays, meta = array_bundle.unpack(states_c["j"].to_bytes())
    meta["format"] = 1  # what a worker that kept CPU in cores saved
    migrated = RecommenderState.from_bytes(array_bundle.pack(arrays, meta))
    expected = RecommenderState.from_bytes(states_mc["j"].to_bytes())
    cpu, want = migrated.cpu, expected.cpu
    np.testing.assert_allclose(cpu.values, want.values, rtol=1e-9)
    np.testing.assert_allclose(cpu.window.avg_weighted_sum, want.window.avg_weighted_sum, rtol=1e-9)
    np.testing.assert_array_equal(cpu.window.decayed, want.window.decayed)
    np.testing.assert_array_equal(cpu.ml.raw_limit, want.ml.raw_limit)
    np.testing.assert_allclose(cpu.ml.cost, want.ml.cost, rtol=1e-9)
    for ring, want_ring in zip(cpu.hour_max, want.hour_max, strict=True):
        np.testing.assert_allclose(ring.values, want_ring.values, rtol=1e-9)
    np.testing.assert_allclose(migrated.signal.sums, expected.signal.sums, rtol=1e-9)
    assert migrated.usage_statistic == pytest.approx(expected.usage_statistic, rel=1e-9)
    row, want_row = migrated.rows[Resource.CPU], expected.rows[Resource.CPU]
    np.testing.assert_allclose(row.value, want_row.value, rtol=1e-9)
    np.testing.assert_allclose(row.raw_value, want_row.raw_value, rtol=1e-9)
    np.testing.assert_allclose(migrated.memory.values, expected.memory.values)
