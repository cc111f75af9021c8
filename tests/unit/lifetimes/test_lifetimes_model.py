"""The LightGBM remaining-lifetime model (LAVA §3): training, E[T_r | T_u], one VM vs batches, files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cellpilot.lifetimes.features import NUM_FEATURES, model_inputs
from cellpilot.lifetimes.model import LabelTransform, LifetimeModel, TrainingParams

HOUR = 3600.0
SMALL = TrainingParams(num_trees=60, num_leaves=8, min_data_in_leaf=5, learning_rate=0.2)


def vms(categories: list[int]) -> np.ndarray:
    """Feature rows that differ only in the category column."""
    x = np.zeros((len(categories), NUM_FEATURES))
    x[:, 0] = 2.0  # cores
    x[:, 1] = 8.0  # memory
    x[:, 3] = categories
    return x


@pytest.fixture(scope="module")
def bimodal() -> LifetimeModel:
    """Category 0: always 2 h. Category 1: half live 1 h, half 100 h (same features: a mixture)."""
    cats = [0] * 200 + [1] * 400
    life = np.array([2.0] * 200 + [1.0, 100.0] * 200) * HOUR
    return LifetimeModel.train(vms(cats), life, SMALL)


def test_predicts_deterministic_lifetimes(bimodal: LifetimeModel) -> None:
    at = np.array([0.0, 0.5, 1.5]) * HOUR
    got = bimodal.predict_remaining(vms([0, 0, 0]), at)
    np.testing.assert_allclose(got / HOUR, [2.0, 1.5, 0.5], atol=0.15)


def test_remaining_lifetime_is_the_conditional_expectation(bimodal: LifetimeModel) -> None:
    # At creation: E[L] = (1 + 100) / 2 h. Once the VM has run 10 h, only the 100 h mode is
    # left (Figure 2's point): E[T_r | T_u = 10 h] = 90 h.
    at_creation, after_10h = bimodal.predict_remaining(vms([1, 1]), np.array([0.0, 10.0 * HOUR])) / HOUR
    assert at_creation == pytest.approx(50.5, rel=0.1)
    assert after_10h == pytest.approx(90.0, rel=0.1)


def test_log_label_predicts_the_geometric_mean() -> None:
    life = np.array([1.0, 100.0] * 200) * HOUR
    model = LifetimeModel.train(vms([1] * 400), life, TrainingParams(**{**SMALL.__dict__, "label": "log"}))
    minutes = np.array([60.0, 6000.0])
    expected = 60.0 * np.expm1(np.mean(np.log1p(minutes)))  # inverse of the mean transformed label
    got = model.predict_remaining(vms([1]), np.zeros(1))[0]
    assert got == pytest.approx(expected, rel=0.1)
    assert model.label is LabelTransform.LOG


def test_label_cap_bounds_predictions() -> None:
    life = np.array([5000.0] * 100) * HOUR
    params = TrainingParams(**{**SMALL.__dict__, "label_cap_hours": 1000.0})
    model = LifetimeModel.train(vms([0] * 100), life, params)
    assert model.predict_remaining(vms([0]), np.zeros(1))[0] / HOUR == pytest.approx(1000.0, rel=0.02)


def test_one_vm_matches_the_batch(bimodal: LifetimeModel) -> None:
    x = vms([0, 1, 1, 0])
    uptime = np.array([0.0, 0.0, 5.0, 1.0]) * HOUR
    batch = bimodal.predict_remaining(x, uptime)
    one = [bimodal.predict_remaining_one(x[i], float(uptime[i])) for i in range(4)]
    np.testing.assert_allclose(one, batch, rtol=1e-9)
    assert bimodal.has_fast_single_row  # LightGBM 4 exposes the single-row entry point


def test_batch_matches_the_booster_directly(bimodal: LifetimeModel) -> None:
    x = vms([0, 1])
    raw = bimodal.booster.predict(model_inputs(x, np.zeros(2)))
    np.testing.assert_allclose(bimodal.predict_remaining(x, 0.0), raw * HOUR)


def test_empty_batch() -> None:
    model = LifetimeModel.train(vms([0] * 20), np.full(20, HOUR), SMALL)
    assert model.predict_remaining(np.zeros((0, NUM_FEATURES)), np.zeros(0)).shape == (0,)


def test_save_and_load_round_trip(bimodal: LifetimeModel, tmp_path: Path) -> None:
    path = tmp_path / "lifetimes.json"
    bimodal.save(path)
    loaded = LifetimeModel.load(path)
    x = vms([0, 1, 1])
    uptime = np.array([0.0, 0.0, 20.0]) * HOUR
    np.testing.assert_array_equal(loaded.predict_remaining(x, uptime), bimodal.predict_remaining(x, uptime))
    assert loaded.label is bimodal.label


def test_load_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a lifetime model"):
        LifetimeModel.load(path)


@pytest.mark.parametrize(
    "kwargs",
    [{"num_trees": 0}, {"num_leaves": 1}, {"learning_rate": 0.0}, {"label_cap_hours": -1.0}],
    ids=["trees", "leaves", "learning-rate", "cap"],
)
def test_training_params_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TrainingParams(**kwargs)  # type: ignore[arg-type]
