"""Property tests (hypothesis): monotonicity, S_max vs the peak, restartable state, and
incremental updates equal to from-scratch evaluations of the same history."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ml_reference import Params, brute_force

from cellpilot.autopilot.candidates import (
    CandidateConfig,
    CandidateState,
    initial_candidate_state,
    update_candidates,
)
from cellpilot.autopilot.recommender_registry import BUILTIN_RECOMMENDERS
from cellpilot.job_vocabulary import RecommenderKind
from cellpilot.recommend.horizontal import (
    CpuHorizontalRecommender,
    CpuUtilisationSource,
    DeferSmallChanges,
    HorizontalState,
    LimitGrowth,
    StabiliserConfig,
)
from cellpilot.recommend.ml_ensemble import (
    EnsembleConfig,
    MarginMode,
    ModelGrid,
    initial_ensemble_state,
    update_ensemble,
)
from cellpilot.recommend.moving_window import (
    WindowConfig,
    initial_window_state,
    update_window,
    weighted_percentile,
)
from cellpilot.usage.buckets import CPU_SCHEME, Resource
from cellpilot.usage.histogram import Histogram

FIVE = 300_000
B = CPU_SCHEME.boundaries
# Every built-in vertical recommender (the worker's candidates: every moving-window statistic
# and the ML ensemble), all on the CPU bucket scheme so one histogram strategy serves all.
CONFIG = CandidateConfig.for_resource(Resource.CPU)
RECOMMENDERS = [kind.value for kind in BUILTIN_RECOMMENDERS]

# A history: per 5-minute window, sparse counts {bucket: samples} kept away from the top
# bucket (so shifting up stays inside the scheme), and time gaps between windows.
windows = st.lists(
    st.tuples(
        st.dictionaries(st.integers(40, 360), st.integers(1, 300), max_size=6),
        st.integers(1, 12),  # gap in 5-minute windows
    ),
    min_size=1,
    max_size=8,
)


def dense(window: dict[int, int], shift: int = 0) -> np.ndarray:
    counts = np.zeros(B.size)
    for bucket, n in window.items():
        counts[bucket + shift] += n
    return counts


def run(kind: str, history: list[tuple[dict[int, int], int]], shift: int = 0) -> list[float]:
    column = BUILTIN_RECOMMENDERS.index(RecommenderKind(kind))
    state = initial_candidate_state(CONFIG)
    t, out = 0, []
    for window, gap in history:
        t += gap * FIVE
        state, batch = update_candidates(CONFIG, state, dense(window, shift)[None, :], np.array([t]))
        out.append(float(batch.value[0, column]))
    return out


@pytest.mark.parametrize("name", RECOMMENDERS, ids=RECOMMENDERS)
@settings(max_examples=25, deadline=None)
@given(history=windows, shift=st.integers(1, 20))
def test_recommendations_are_monotone_when_all_usage_is_scaled_up(
    name: str, history: list[tuple[dict[int, int], int]], shift: int
) -> None:
    # With geometric buckets, multiplying every sample by ratio**shift moves every count up
    # by ``shift`` buckets: a uniform shift on the scheme's (logarithmic) scale.
    base = np.asarray(run(name, history))
    scaled = np.asarray(run(name, history, shift))
    assert np.array_equal(np.isnan(base), np.isnan(scaled))
    known = ~np.isnan(base)
    assert np.all(scaled[known] >= base[known])


raw_windows = st.lists(
    st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=1, max_size=30), min_size=1, max_size=6
)


@settings(max_examples=40, deadline=None)
@given(samples=raw_windows, offset=st.floats(0.0, 50.0, allow_nan=False))
def test_s_max_and_s_avg_are_monotone_under_an_additive_shift(
    samples: list[list[float]], offset: float
) -> None:
    config = WindowConfig(half_life_ms=12 * 3_600_000)

    def stats(delta: float) -> dict[str, np.ndarray]:
        state = initial_window_state(1, B.size, config)
        out: dict[str, np.ndarray] = {}
        for i, values in enumerate(samples):
            counts = Histogram.from_values(CPU_SCHEME, i * FIVE, np.asarray(values) + delta).counts
            state, window = update_window(config, B, state, counts[None, :], np.array([i * FIVE]))
            out = window.as_dict()
        out["count_p90"] = weighted_percentile(B, state.decayed, 90.0)
        return out

    base, shifted = stats(0.0), stats(offset)
    for name in ("max", "avg", "count_p90"):
        assert float(shifted[name][0]) >= float(base[name][0])


def test_load_adjusted_percentile_is_not_monotone_under_an_additive_shift() -> None:
    # Why the property above is restricted: loads 1, 2, 10 give h = [1, 2, 10]; 25 % of 13 needs
    # the bucket valued 10. Adding 1 to every sample gives h = [2, 3, 11]; 25 % of 16 is reached
    # at 3. A uniform additive shift changes the load shares, so S_pj can fall.
    b = np.array([1.0, 2.0, 3.0, 10.0, 11.0])
    assert float(weighted_percentile(b, b * np.array([1, 1, 0, 1, 0]), 25.0)) == 10.0
    assert float(weighted_percentile(b, b * np.array([0, 1, 1, 0, 1]), 25.0)) == 3.0


@settings(max_examples=40, deadline=None)
@given(samples=raw_windows, peak_samples=st.integers(1, 8))
def test_s_max_is_never_below_the_observed_peak(samples: list[list[float]], peak_samples: int) -> None:
    config = WindowConfig(half_life_ms=3_600_000, peak_samples=peak_samples)
    candidates = CandidateConfig(Resource.CPU, CPU_SCHEME, config, CONFIG.margin, with_ml=False)
    column = BUILTIN_RECOMMENDERS.index(RecommenderKind.MOVING_WINDOW_MAX)
    state = initial_window_state(1, B.size, config)
    candidate_state = initial_candidate_state(candidates)
    for i, values in enumerate(samples):
        hist = Histogram.from_values(CPU_SCHEME, i * FIVE, values)
        state, window = update_window(config, B, state, hist.counts[None, :], np.array([hist.end_ms]))
        candidate_state, batch = update_candidates(
            candidates, candidate_state, hist.counts[None, :], np.array([hist.end_ms])
        )
        peak = max(max(v) for v in samples[max(0, i + 1 - peak_samples) : i + 1])
        assert float(window.s_max[0]) >= peak
        assert float(batch.value[0, column]) >= peak


def equal_outputs(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True))


@settings(max_examples=10, deadline=None)
@given(history=windows, cut=st.integers(0, 8))
def test_vertical_state_round_trips_through_bytes(
    history: list[tuple[dict[int, int], int]], cut: int
) -> None:
    state = initial_candidate_state(CONFIG)
    restored = initial_candidate_state(CONFIG)
    t = 0
    for i, (window, gap) in enumerate(history):
        t += gap * FIVE
        if i == cut:
            data = restored.to_bytes()
            restored = CandidateState.from_bytes(data)
            assert restored.equals(state)
            assert restored.to_bytes() == data
        counts, times = dense(window)[None, :], np.array([t])
        state, expected = update_candidates(CONFIG, state, counts, times)
        restored, got = update_candidates(CONFIG, restored, counts, times)
        assert np.array_equal(expected.value, got.value, equal_nan=True)
    assert CandidateState.from_bytes(state.to_bytes()).equals(state)


@settings(max_examples=30, deadline=None)
@given(
    script=st.lists(
        st.tuples(st.floats(0.0, 500.0), st.integers(0, 20), st.integers(1, 30)), min_size=1, max_size=12
    ),
    cut=st.integers(0, 12),
)
def test_horizontal_state_round_trips_through_bytes(script: list[tuple[float, int, int]], cut: int) -> None:
    recommender = CpuHorizontalRecommender(
        CpuUtilisationSource(target_utilisation=0.6),
        StabiliserConfig(defer_small_changes=DeferSmallChanges(), limit_growth=LimitGrowth()),
    )

    def play(restart: bool) -> list[int]:
        state = recommender.initial_state()
        t, current, out = 0, 10, []
        for i, (usage, initialising, gap) in enumerate(script):
            if restart and i == cut:
                data = state.to_bytes()
                state = HorizontalState.from_bytes(data)
                assert state.to_bytes() == data
            t += gap * 60_000
            state, decision = recommender.update(
                state,
                np.array([usage]),
                np.array([2.0]),
                np.array([current]),
                np.array([t]),
                np.array([initialising]),
            )
            current = int(decision.target[0])
            out.append(current)
        return out

    assert play(restart=True) == play(restart=False)


def window_from_scratch(
    history: list[tuple[int, np.ndarray]], half_life_ms: int, peak_samples: int
) -> tuple[float, float, np.ndarray]:
    """Eqs. 1-3 evaluated directly over the whole history: (S_max, S_avg, load-adjusted h)."""
    now = history[-1][0]
    decayed = np.zeros(B.size)
    num = den = 0.0
    for t, counts in history:
        w = 2.0 ** (-(now - t) / half_life_ms)
        decayed += w * counts
        if counts.sum() > 0:
            num += w * sum(B[k] * counts[k] for k in range(B.size)) / counts.sum()
            den += w
    peaks = [max(B[k] for k in range(B.size) if c[k] > 0) for _, c in history[-peak_samples:] if c.sum() > 0]
    s_max = max(peaks) if peaks else float("nan")
    s_avg = num / den if den > 0 else float("nan")
    return s_max, s_avg, B * decayed


def satisfies_percentile(value: float, load: np.ndarray, level: float) -> bool:
    """``value`` is a bucket value where the cumulative load share first reaches ``level`` %."""
    share = np.cumsum(load) / load.sum()
    k = int(np.searchsorted(B, value))
    below = share[k - 1] if k > 0 else 0.0
    return bool(B[k] == value and share[k] >= level / 100 - 1e-9 and below < level / 100 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(history=windows, peak_samples=st.integers(1, 5), half_life_windows=st.integers(1, 100))
def test_incremental_window_equals_from_scratch(
    history: list[tuple[dict[int, int], int]], peak_samples: int, half_life_windows: int
) -> None:
    config = WindowConfig(half_life_ms=half_life_windows * FIVE, peak_samples=peak_samples)
    state = initial_window_state(1, B.size, config)
    seen: list[tuple[int, np.ndarray]] = []
    t = 0
    for window, gap in history:
        t += gap * FIVE
        seen.append((t, dense(window)))
        state, stats = update_window(config, B, state, seen[-1][1][None, :], np.array([t]))
        s_max, s_avg, load = window_from_scratch(seen, config.half_life_ms, peak_samples)
        assert float(stats.s_max[0]) == pytest.approx(s_max, nan_ok=True)
        assert float(stats.s_avg[0]) == pytest.approx(s_avg, rel=1e-9, nan_ok=True)
        for level in config.percentiles:
            value = float(stats.percentile(level)[0])
            if load.sum() == 0:
                assert np.isnan(value)
            else:
                assert satisfies_percentile(value, load, level)


small_histograms = st.lists(st.lists(st.integers(0, 4), min_size=6, max_size=6), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(
    histograms=small_histograms,
    additive=st.booleans(),
    at_previous=st.booleans(),
    w_dl=st.sampled_from([0.0, 0.25, 1.0]),
    w_dm=st.sampled_from([0.0, 0.5, 2.0]),
)
def test_incremental_ml_equals_the_brute_force_replay(
    histograms: list[list[int]], additive: bool, at_previous: bool, w_dl: float, w_dm: float
) -> None:
    bounds = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    grid = ModelGrid.product(
        (0.5, 0.25, 0.125), (0.0, 0.5), MarginMode.ADDITIVE if additive else MarginMode.RELATIVE
    )
    config = EnsembleConfig(
        grid=grid,
        cost_decay=0.5,
        w_overrun=1.0,
        w_underrun=0.25,
        w_limit_change=w_dl,
        w_model_change=w_dm,
        normalise_histograms=False,
        cost_at_previous_limit=at_previous,
    )
    params = Params(grid.decay_rates, grid.margins, additive, 0.5, 1.0, 0.25, w_dl, w_dm, False, at_previous)
    expected = brute_force(bounds, [[float(c) for c in h] for h in histograms], params)
    state = initial_ensemble_state(1, len(bounds), config)
    for step, counts in enumerate(histograms):
        state, decision = update_ensemble(
            config, np.asarray(bounds), state, np.asarray([counts], dtype=float), np.array([step])
        )
        assert (int(decision.model[0]), float(decision.limit[0])) == expected[step]
