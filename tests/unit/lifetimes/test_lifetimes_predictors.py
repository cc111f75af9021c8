"""Predictors bound to a trace: the model and the oracle (LAVA §6.1)."""

from __future__ import annotations

import numpy as np

from cellpilot.lifetimes.features import FEATURE_NAMES, model_inputs, vm_features
from cellpilot.lifetimes.model import LifetimeModel, TrainingParams
from cellpilot.lifetimes.predictors import SMALL_BATCH, ModelPredictor, OraclePredictor
from cellpilot.workloads.vm_trace import VmTraceConfig, generate_vm_trace

HOUR = 3600.0


def small_trace() -> object:
    return generate_vm_trace(
        np.random.default_rng(3), VmTraceConfig(days=0.5, hosts=4, calibration_samples=4000)
    )


def test_features_follow_the_trace_columns() -> None:
    trace = small_trace()
    x = vm_features(trace)
    assert x.shape == (len(trace), len(FEATURE_NAMES))
    np.testing.assert_array_equal(x[:, FEATURE_NAMES.index("cores")], trace.cores)
    np.testing.assert_array_equal(x[:, FEATURE_NAMES.index("tier")], trace.tier)
    hours = x[:, FEATURE_NAMES.index("created_hour")]
    assert np.all((hours >= 0) & (hours < 24))
    inputs = model_inputs(x[:2], np.array([0.0, 2 * HOUR]))
    np.testing.assert_array_equal(inputs[:, -1], [0.0, 2.0])


def test_oracle_knows_the_remaining_lifetime() -> None:
    trace = small_trace()
    oracle = OraclePredictor(trace)
    rows = np.array([0, 5, 9])
    uptime = np.array([0.0, 60.0, 1e12])
    expected = np.maximum(trace.deleted[rows] - trace.created[rows] - uptime, 0.0)
    np.testing.assert_allclose(oracle.remaining(rows, uptime), expected)
    assert not oracle.repredicts


def test_model_predictor_one_by_one_equals_batch() -> None:
    trace = small_trace()
    model = LifetimeModel.train(vm_features(trace), trace.lifetime, TrainingParams(num_trees=10))
    predictor = ModelPredictor(model, trace)
    rows = np.arange(SMALL_BATCH + 5)
    uptime = np.linspace(0.0, 10 * HOUR, rows.size)
    batch = predictor.remaining(rows, uptime)  # above SMALL_BATCH: one LightGBM call
    small = np.concatenate(
        [predictor.remaining(rows[i : i + 3], uptime[i : i + 3]) for i in range(0, rows.size, 3)]
    )
    np.testing.assert_allclose(small, batch, rtol=1e-9)
    assert predictor.predictions == 2 * rows.size
