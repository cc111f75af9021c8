"""The ML ensemble (eqs. 4-9) against a literal brute-force evaluation and by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from ml_reference import Params, brute_force

from cellpilot.recommend.ml_ensemble import (
    EnsembleConfig,
    MarginMode,
    ModelGrid,
    initial_ensemble_state,
    model_limits,
    update_ensemble,
)

B = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
BOUNDS = np.asarray(B)
# Each histogram holds 8 samples so normalised values stay exact binary fractions.
SEQUENCE = [
    [0, 0, 8, 0, 0, 0],
    [0, 0, 6, 2, 0, 0],
    [0, 0, 4, 4, 0, 0],
    [0, 1, 3, 3, 1, 0],
    [0, 0, 0, 0, 8, 0],
    [0, 0, 0, 0, 8, 0],
    [4, 4, 0, 0, 0, 0],
    [0, 0, 8, 0, 0, 0],
    [0, 0, 2, 2, 2, 2],
    [0, 0, 0, 0, 0, 8],
    [0, 0, 8, 0, 0, 0],
]


def config_and_params(
    additive: bool, normalise: bool, at_previous: bool, margins: tuple[float, float]
) -> tuple[EnsembleConfig, Params]:
    grid = ModelGrid.product(
        (0.5, 0.25, 1.0), margins, MarginMode.ADDITIVE if additive else MarginMode.RELATIVE
    )
    # Penalties relative to a histogram's mass: 8 samples, or 1 when normalised.
    scale = 0.125 if normalise else 1.0
    weights = {"d": 0.5, "w_o": 1.0, "w_u": 0.25, "w_dl": 0.5 * scale, "w_dm": 0.25 * scale}
    config = EnsembleConfig(
        grid=grid,
        cost_decay=weights["d"],
        w_overrun=weights["w_o"],
        w_underrun=weights["w_u"],
        w_limit_change=weights["w_dl"],
        w_model_change=weights["w_dm"],
        normalise_histograms=normalise,
        cost_at_previous_limit=at_previous,
    )
    params = Params(
        grid.decay_rates, grid.margins, additive, normalise=normalise, at_previous=at_previous, **weights
    )
    return config, params


def run(
    config: EnsembleConfig, histograms: np.ndarray, chunk_jobs: int = 512
) -> list[list[tuple[int, float]]]:
    """histograms (T, J, K) -> per step, per job (model, limit)."""
    steps, jobs, _ = histograms.shape
    state = initial_ensemble_state(jobs, BOUNDS.size, config)
    out = []
    for t in range(steps):
        state, decision = update_ensemble(
            config, BOUNDS, state, histograms[t], np.full(jobs, t * 300_000), chunk_jobs=chunk_jobs
        )
        out.append(list(zip(decision.model.tolist(), decision.limit.tolist(), strict=True)))
    return out


def test_first_step_by_hand() -> None:
    # All 8 samples in the bucket valued 3. Every model's arg-min is L' = 3 (no over-, no
    # underrun). Margins +0 and +1 (additive): L_m = 3 or 4. Eq. 8 at the first step, d = 0.5:
    # margin 0 costs 0; margin 1 has 8 samples below 4: c = 0.5 * (0.25 * 8) = 1. Model 0 wins.
    config, _ = config_and_params(additive=True, normalise=False, at_previous=False, margins=(0.0, 1.0))
    state = initial_ensemble_state(1, BOUNDS.size, config)
    state, decision = update_ensemble(config, BOUNDS, state, np.array([SEQUENCE[0]], float), np.array([0]))
    assert state.raw_limit[0].tolist() == [2] * 6
    assert state.cost[0].tolist() == [0.0, 1.0] * 3
    assert (int(decision.model[0]), float(decision.limit[0])) == (0, 3.0)
    assert model_limits(config, BOUNDS, state)[0].tolist() == [3.0, 4.0] * 3


@pytest.mark.parametrize(
    ("additive", "normalise", "at_previous", "margins"),
    [
        (True, False, False, (0.0, 1.0)),
        (False, True, True, (0.0, 0.5)),
        (False, False, True, (0.0, 0.5)),
        (True, True, False, (0.0, 1.0)),
        (True, False, True, (0.5, 1.0)),
    ],
    ids=[
        "literal-eqs-additive-counts",
        "default-reading-relative-normalised",
        "relative-counts-previous-limit",
        "additive-normalised-literal",
        "additive-counts-previous-limit",
    ],
)
def test_chosen_model_and_limit_match_the_brute_force(
    additive: bool, normalise: bool, at_previous: bool, margins: tuple[float, float]
) -> None:
    config, params = config_and_params(additive, normalise, at_previous, margins)
    # Three jobs in one batch: the sequence, its reverse, and a shifted copy.
    seq = np.asarray(SEQUENCE, dtype=float)
    jobs = [seq, seq[::-1], np.roll(seq, 1, axis=1)]
    histograms = np.stack(jobs, axis=1)
    expected = [brute_force(B, job.tolist(), params) for job in jobs]
    for chunk in (1, 512):
        got = run(config, histograms, chunk_jobs=chunk)
        for j in range(len(jobs)):
            assert [step[j] for step in got] == expected[j]
    # The sequence exercises limit changes (and the test would notice a frozen recommender).
    assert len({limit for _, limit in expected[0]}) >= 3


def test_switching_penalties_suppress_oscillation() -> None:
    # Usage alternates between the buckets valued 2 and 5. With w_o = w_u, each model's
    # arg-min follows whichever bucket the smoothed histogram currently favours.
    a = [0, 8, 0, 0, 0, 0]
    b = [0, 0, 0, 0, 8, 0]
    histograms = np.asarray([a, b] * 12, dtype=float)[:, None, :]

    def limit_changes(w_dl: float, w_dm: float) -> tuple[int, int]:
        config = EnsembleConfig(
            grid=ModelGrid.product((0.5, 0.6), (0.0, 0.1)),
            cost_decay=0.5,
            w_overrun=1.0,
            w_underrun=1.0,
            w_limit_change=w_dl,
            w_model_change=w_dm,
        )
        steps = [step[0] for step in run(config, histograms)][4:]  # after warm-up
        limits = [limit for _, limit in steps]
        models = [model for model, _ in steps]
        return (
            sum(x != y for x, y in itertools.pairwise(limits)),
            sum(x != y for x, y in itertools.pairwise(models)),
        )

    free_limit_changes, _ = limit_changes(0.0, 0.0)
    # Eqs. 4-5 count raw samples (8 per histogram): penalties of half a histogram's mass.
    held_limit_changes, held_model_changes = limit_changes(4.0, 4.0)
    assert free_limit_changes >= 15  # it flips almost every step without penalties
    assert held_limit_changes <= 1
    assert held_model_changes <= 1


def test_grid_deduplicates_decay_rates() -> None:
    grid = ModelGrid.product((0.1, 0.2), (0.0, 0.05, 0.1))
    assert grid.models == 6
    assert grid.distinct_decays == (0.1, 0.2)
    assert grid.decay_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert ModelGrid.product().models >= 100


@pytest.mark.parametrize(
    "kwargs",
    [{"cost_decay": 0.0}, {"cost_decay": 1.5}, {"w_overrun": -1.0}],
    ids=["zero-decay", "decay-above-one", "negative-weight"],
)
def test_invalid_configuration_is_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EnsembleConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("decays", "margins"),
    [((), ()), ((0.0,), (0.0,)), ((0.5,), (0.0, 0.1))],
    ids=["empty", "zero-decay", "length-mismatch"],
)
def test_invalid_grids_are_rejected(decays: tuple[float, ...], margins: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        ModelGrid(decays, margins)


def test_state_from_another_grid_is_rejected() -> None:
    config, _ = config_and_params(True, False, False, (0.0, 1.0))
    other = EnsembleConfig(grid=ModelGrid.product((0.5,), (0.0,)))
    state = initial_ensemble_state(1, BOUNDS.size, other)
    with pytest.raises(ValueError):
        update_ensemble(config, BOUNDS, state, np.array([SEQUENCE[0]], float), np.array([0]))
