"""The lifetime distribution model (LAVA §3) and its predictor: calibration, APIs, files, no leakage."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cellpilot.lifetimes.distribution import NUM_BINS, LifetimeDistribution, lifetime_bin
from cellpilot.lifetimes.distribution_model import DistributionModel, DistributionParams
from cellpilot.lifetimes.features import NUM_FEATURES, vm_features
from cellpilot.lifetimes.lifetime_classes import LIFETIME_CLASS_UPPER
from cellpilot.lifetimes.predictors import DEFAULT_CLASS_RISK, DistributionPredictor, estimate_lifetimes
from cellpilot.lifetimes.training_examples import expand_at_uptimes
from cellpilot.lifetimes.vm_table import VmTrace
from cellpilot.workloads.vm_trace import VmTraceConfig, generate_vm_trace

HOUR = 3600.0
SMALL = DistributionParams(max_trees=60, num_leaves=4, min_data_in_leaf=20, learning_rate=0.2)


def vms(categories: list[int]) -> np.ndarray:
    x = np.zeros((len(categories), NUM_FEATURES))
    x[:, 0] = 2.0
    x[:, 1] = 8.0
    x[:, 3] = categories
    return x


@pytest.fixture(scope="module")
def mixture() -> DistributionModel:
    """Category 0: always 2 h. Category 1: 70 % live 0.3 h, 30 % live 150 h (a mixture, §2.1)."""
    rng = np.random.default_rng(0)
    cats = rng.integers(0, 2, size=4000)
    life = np.where(cats == 0, 2.0, np.where(rng.random(4000) < 0.7, 0.3, 150.0)) * HOUR
    return DistributionModel.train(vms(cats.tolist()), life, SMALL)


def test_predicts_calibrated_mixture_probabilities(mixture: DistributionModel) -> None:
    d = mixture.predict_distribution(vms([0, 1]))
    assert d.probs[0, lifetime_bin(2.0 * HOUR)] > 0.95
    assert d.probs[1, lifetime_bin(0.3 * HOUR)] == pytest.approx(0.7, abs=0.05)
    assert d.probs[1, lifetime_bin(150.0 * HOUR)] == pytest.approx(0.3, abs=0.05)
    # Repredicting after 1 h of uptime: only the 150 h mode is left (Figure 2).
    after = d.take([1]).class_probabilities(LIFETIME_CLASS_UPPER, HOUR)[0]
    assert after[3] + after[2] > 0.95
    mean0, mean1 = mixture.predict_remaining(vms([1, 1]), np.array([0.0, HOUR])) / HOUR
    assert mean0 == pytest.approx(0.7 * 0.3 + 0.3 * 150, rel=0.15)
    assert mean1 > 100


def test_single_row_matches_the_batch(mixture: DistributionModel) -> None:
    x = vms([0, 1, 1, 0])
    batch = mixture.predict_distribution(x).probs
    for i in range(len(x)):
        np.testing.assert_allclose(mixture.predict_probs_one(x[i]), batch[i], rtol=1e-9)
        np.testing.assert_allclose(mixture.predict_distribution_one(x[i]).probs[0], batch[i], rtol=1e-9)


def test_early_stopping_chooses_the_number_of_trees() -> None:
    # Lifetimes unrelated to the features: held-out log loss stops improving after a few trees.
    rng = np.random.default_rng(6)
    x = vms(rng.integers(0, 5, size=2000).tolist())
    model = DistributionModel.train(x, rng.random(2000) * 200 * HOUR, replace(SMALL, max_trees=200))
    assert 0 < model.num_trees < 100 * NUM_BINS


def test_save_and_load_round_trip(mixture: DistributionModel, tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    mixture.save(path)
    loaded = DistributionModel.load(path)
    np.testing.assert_allclose(
        loaded.predict_distribution(vms([1])).probs, mixture.predict_distribution(vms([1])).probs
    )
    with pytest.raises(ValueError, match="not a lifetime distribution model"):
        DistributionModel.from_json('{"format": "cellpilot.lifetime-model/1"}')


@pytest.mark.parametrize(
    "kwargs",
    [{"max_trees": 0}, {"learning_rate": 0.0}, {"validation_share": 1.0}],
    ids=["trees", "rate", "share"],
)
def test_params_are_validated(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        DistributionParams(**kwargs)


def test_bad_feature_shapes_are_rejected(mixture: DistributionModel) -> None:
    with pytest.raises(ValueError, match="feature columns"):
        mixture.predict_distribution(np.zeros((2, NUM_FEATURES + 1)))
    with pytest.raises(ValueError, match="features must be"):
        DistributionModel.train(np.zeros((3, 2)), np.ones(3), SMALL)


class _Fixed:
    """A stand-in creation-time model with given distributions (what the predictor calls)."""

    uptime_grid = None

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs

    def predict_distribution(self, features: np.ndarray, uptime: float = 0.0) -> LifetimeDistribution:
        return LifetimeDistribution(self.probs[: features.shape[0]])

    def grid_index(self, uptime: np.ndarray) -> np.ndarray:
        return np.zeros(np.shape(uptime), dtype=np.int64)


def trace_of(n: int) -> VmTrace:
    trace = generate_vm_trace(
        np.random.default_rng(1), VmTraceConfig(days=0.2, hosts=2, calibration_samples=2000)
    )
    return trace.subset(np.arange(n))


def mass(**hours_to_p: float) -> np.ndarray:
    p = np.zeros(NUM_BINS)
    for key, share in hours_to_p.items():
        p[lifetime_bin(float(key.removeprefix("h").replace("_", ".")) * HOUR)] += share
    return p


# The risk class (DistributionPredictor): the shortest LAVA class (§4.3) the VM outlives with
# probability at most class_risk, from its distribution conditioned on the uptime.
@pytest.mark.parametrize(
    ("probs", "risk", "uptime_h", "klass"),
    [
        (mass(h0_3=1.0), 0.05, 0.0, 0),  # surely under 1 h
        (mass(h0_3=0.97, h5=0.03), 0.05, 0.0, 0),  # 3 % chance of 1-10 h: within the risk
        (mass(h0_3=0.9, h5=0.1), 0.05, 0.0, 1),  # 10 % chance: class 1-10 h
        (mass(h0_3=0.9, h30=0.1), 0.05, 0.0, 2),  # 10 % chance of a day: 10-100 h
        (mass(h0_3=0.9, h30=0.1), 0.2, 0.0, 0),  # ... unless more risk is accepted
        (mass(h0_3=0.9, h300=0.1), 0.05, 0.0, 3),
        (mass(h0_3=0.9, h300=0.1), 0.05, 1.0, 3),  # after 1 h only the long mode is left
        (mass(h0_3=0.5, h5=0.5), 0.05, 6.0, 1),  # 6 h into the 4-10 h bin: up to 4 h are left
        (mass(h0_3=0.5, h5=0.5), 0.05, 9.5, 0),  # near its end: under 1 h is left
    ],
    ids=["short", "small-risk", "hours", "day", "more-risk", "long", "long-after-1h", "mid-bin", "late"],
)
def test_risk_class(probs: np.ndarray, risk: float, uptime_h: float, klass: int) -> None:
    trace = trace_of(1)
    predictor = DistributionPredictor(_Fixed(probs[None, :]), trace, class_risk=risk)  # type: ignore[arg-type]
    got = predictor.lifetime_classes(np.array([0]), np.array([uptime_h * HOUR]))
    assert int(got[0]) == klass


def test_remaining_is_the_conditional_mean_or_a_quantile() -> None:
    trace = trace_of(1)
    probs = mass(h0_3=0.5, h150=0.5)[None, :]
    mean = DistributionPredictor(_Fixed(probs), trace)  # type: ignore[arg-type]
    q90 = DistributionPredictor(_Fixed(probs), trace, exit_quantile=0.9)  # type: ignore[arg-type]
    d = LifetimeDistribution(probs)
    assert mean.remaining(np.array([0]), np.array([HOUR]))[0] == pytest.approx(d.expected_remaining(HOUR)[0])
    assert q90.remaining(np.array([0]), np.array([0.0]))[0] == pytest.approx(d.quantile(0.9)[0])
    with pytest.raises(ValueError):
        DistributionPredictor(_Fixed(probs), trace, class_risk=0.0)  # type: ignore[arg-type]


# No future leakage: what the model sees of a VM at uptime u is its creation-time features and
# u. Changing anything that happens after the VM's creation + u (its own deletion, any later VM)
# must not change a feature, a prediction or a class at uptime u.
@pytest.mark.parametrize("uptime_input", [False, True], ids=["creation-model", "uptime-model"])
@pytest.mark.parametrize("uptime_h", [0.0, 0.5, 3.0, 40.0])
def test_features_and_predictions_at_uptime_u_use_only_data_up_to_u(
    uptime_h: float, uptime_input: bool
) -> None:
    trace = generate_vm_trace(
        np.random.default_rng(4), VmTraceConfig(days=0.5, hosts=4, calibration_samples=3000)
    )
    rng = np.random.default_rng(5)
    rows = np.flatnonzero(trace.lifetime > uptime_h * HOUR)[:50]
    u = uptime_h * HOUR
    cut = trace.created[rows] + u  # "now" for each VM
    # Another world: the same past, a different future (later deletions; later VMs reshuffled).
    later_deleted = np.maximum(trace.deleted, trace.deleted + rng.random(len(trace)) * 100 * HOUR)
    future = replace(trace, deleted=later_deleted)
    shuffled = np.concatenate(
        [np.arange(rows.max() + 1), rng.permutation(np.arange(rows.max() + 1, len(trace)))]
    )
    future = future.subset(shuffled)
    assert np.all(future.deleted[rows] > cut)  # each VM is still alive at its "now" in both worlds
    np.testing.assert_array_equal(vm_features(trace)[rows], vm_features(future)[rows])
    params = replace(SMALL, uptime_input=uptime_input)
    model = DistributionModel.train(vm_features(trace), trace.lifetime, params)  # on a fixed history
    now_a = DistributionPredictor(model, trace)
    now_b = DistributionPredictor(model, future)
    uptimes = np.full(rows.size, u)
    np.testing.assert_allclose(now_a.remaining(rows, uptimes), now_b.remaining(rows, uptimes))
    np.testing.assert_array_equal(
        now_a.lifetime_classes(rows, uptimes), now_b.lifetime_classes(rows, uptimes)
    )


def test_bins_without_training_examples_get_no_probability(mixture: DistributionModel) -> None:
    # The mixture's lifetimes (0.3, 2, 150 h) fill three bins; the model has a class for those
    # only (empty classes once stopped training after one round), the rest get exactly 0.
    present = {int(lifetime_bin(h * HOUR)) for h in (0.3, 2.0, 150.0)}
    assert set(mixture.bins) == present
    probs = mixture.predict_distribution(vms([0, 1])).probs
    absent = [b for b in range(NUM_BINS) if b not in present]
    assert np.all(probs[:, absent] == 0.0)
    assert mixture.num_trees > 3 * 5  # more than a handful of boosting rounds


def test_examples_at_an_uptime_are_the_vms_alive_then() -> None:
    life = np.array([0.5, 3.0, 30.0]) * HOUR
    grid = np.array([0.0, 1.0, 10.0, 100.0]) * HOUR
    inputs, labels, rows = expand_at_uptimes(vms([0, 1, 2]), life, grid)
    assert rows.tolist() == [0, 1, 2, 1, 2, 2]  # none at 100 h: nobody lived that long
    assert (inputs[:, -1]).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 10.0]  # uptime in hours, last column
    np.testing.assert_array_equal(labels, life[rows])  # the label is the whole lifetime
    with pytest.raises(ValueError, match="increasing"):
        expand_at_uptimes(vms([0]), life[:1], np.array([1.0, 0.0]))


@pytest.fixture(scope="module")
def uptime_model() -> DistributionModel:
    """The mixture of :func:`mixture`, learnt with the uptime as an input (§3's expansion)."""
    rng = np.random.default_rng(0)
    cats = rng.integers(0, 2, size=4000)
    life = np.where(cats == 0, 2.0, np.where(rng.random(4000) < 0.7, 0.3, 150.0)) * HOUR
    return DistributionModel.train(vms(cats.tolist()), life, replace(SMALL, uptime_input=True))


def test_the_uptime_model_learns_what_is_left_after_an_uptime(uptime_model: DistributionModel) -> None:
    assert uptime_model.uptime_aware
    at_creation = uptime_model.predict_distribution(vms([1]))
    assert at_creation.probs[0, lifetime_bin(0.3 * HOUR)] == pytest.approx(0.7, abs=0.05)
    # At 1 h of uptime the model is run at the 1 h grid uptime: only the 150 h mode is left.
    x = vms([1, 1])
    u = np.array([0.0, 1.5 * HOUR])
    assert uptime_model.grid_index(u).tolist() == [0, 4]
    later = uptime_model.predict_distribution(x[1:], u[1])
    assert later.probs[0, lifetime_bin(150.0 * HOUR)] > 0.95
    mean0, mean1 = uptime_model.predict_remaining(x, u) / HOUR
    assert mean0 == pytest.approx(0.7 * 0.3 + 0.3 * 150, rel=0.15)
    assert mean1 == pytest.approx(150 - 1.5, rel=0.15)
    # One rule for LAVA's class, whichever model: outlives 100 h w.p. ~30 % -> LC4.
    est = estimate_lifetimes(uptime_model, x, u, DEFAULT_CLASS_RISK)
    assert est.lifetime_class.tolist() == [3, 3]
    np.testing.assert_allclose(uptime_model.predict_probs_one(x[1], u[1]), later.probs[0], rtol=1e-9)


def test_the_uptime_model_round_trips_through_its_file(
    uptime_model: DistributionModel, tmp_path: Path
) -> None:
    path = tmp_path / "model.json"
    uptime_model.save(path)
    loaded = DistributionModel.load(path)
    assert (loaded.uptime_grid_hours, loaded.bins) == (uptime_model.uptime_grid_hours, uptime_model.bins)
    x, u = vms([0, 1]), np.array([0.0, 20 * HOUR])
    np.testing.assert_allclose(loaded.predict_remaining(x, u), uptime_model.predict_remaining(x, u))
