"""Moving-window statistics (§3.2.2, eqs. 1-3) on inputs small enough to compute by hand."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.recommend.moving_window import (
    CPU_HALF_LIFE_MS,
    MEMORY_HALF_LIFE_MS,
    WindowConfig,
    WindowState,
    decay_weight,
    initial_window_state,
    statistics_from_history,
    update_window,
    weighted_percentile,
)
from cellpilot.usage.buckets import Resource

B = np.array([1.0, 2.0, 4.0, 8.0])
HL = 3_600_000  # a one-hour half-life keeps the hand computations readable


def feed(
    config: WindowConfig, boundaries: np.ndarray, history: list[tuple[int, list[float]]]
) -> tuple[WindowState, dict[str, float]]:
    """Run one job through ``history`` [(time_ms, counts)], return the state and last statistics."""
    state = initial_window_state(1, boundaries.size, config)
    stats: dict[str, float] = {}
    for t, counts in history:
        state, out = update_window(config, boundaries, state, np.array([counts], dtype=float), np.array([t]))
        stats = {name: float(values[0]) for name, values in out.as_dict().items()}
    return state, stats


def test_figure_2_time_percentile_is_1_and_load_adjusted_percentile_is_10() -> None:
    # Figure 2: load 1 for 9 time units, load 10 for 1 time unit; bucket values 1 and 10.
    boundaries = np.array([1.0, 10.0])
    counts = [9.0, 1.0]
    config = WindowConfig(half_life_ms=HL, percentiles=(90.0,))
    _, stats = feed(config, boundaries, [(0, counts)])
    assert float(weighted_percentile(boundaries, counts, 90.0)) == 1.0  # "90%ile by time"
    assert stats["p90"] == 10.0  # load-adjusted: h = [1*9, 10*1], 90 % of 19 needs bucket 10
    # With the limit at 1, the load above it is 9 of the 19 units (the figure's dashed line).
    assert pytest.approx(9 / 19) == (10.0 - 1.0) / (1.0 * 9 + 10.0 * 1)


@pytest.mark.parametrize(
    ("age_ms", "weight"),
    [(0, 1.0), (HL, 0.5), (2 * HL, 0.25), (HL // 2, 2**-0.5)],
    ids=["now", "one-half-life", "two-half-lives", "half-a-half-life"],
)
def test_decay_weight_halves_every_half_life(age_ms: int, weight: float) -> None:
    assert float(decay_weight(age_ms, HL)) == pytest.approx(weight, rel=1e-15)


def test_a_sample_one_half_life_old_weighs_exactly_half() -> None:
    config = WindowConfig(half_life_ms=HL)
    state, _ = feed(config, B, [(0, [3.0, 0.0, 5.0, 1.0]), (HL, [0.0, 0.0, 0.0, 0.0])])
    assert state.decayed[0].tolist() == [1.5, 0.0, 2.5, 0.5]


@pytest.mark.parametrize(
    ("resource", "half_life_h"), [(Resource.CPU, 12), (Resource.MEMORY, 48)], ids=["cpu", "memory"]
)
def test_default_half_lives(resource: Resource, half_life_h: int) -> None:
    assert WindowConfig.for_resource(resource).half_life_ms == half_life_h * 3_600_000
    assert (CPU_HALF_LIFE_MS, MEMORY_HALF_LIFE_MS) == (12 * 3_600_000, 48 * 3_600_000)


def test_s_avg_by_hand() -> None:
    config = WindowConfig(half_life_ms=HL)
    h1 = [2.0, 0.0, 0.0, 2.0]  # mean (2*1 + 2*8) / 4 = 4.5
    h2 = [0.0, 1.0, 0.0, 0.0]  # mean 2
    _, stats = feed(config, B, [(0, h1), (HL, h2)])
    assert stats["avg"] == pytest.approx((0.5 * 4.5 + 1.0 * 2.0) / (0.5 + 1.0))
    # An empty window adds no sample to the average; the ratio of the weights is unchanged.
    _, stats = feed(config, B, [(0, h1), (HL, h2), (2 * HL, [0.0] * 4)])
    assert stats["avg"] == pytest.approx((0.25 * 4.5 + 0.5 * 2.0) / (0.25 + 0.5))


@pytest.mark.parametrize(
    ("level", "expected"),
    # decayed D = 0.5 * [2, 0, 0, 2] + [0, 1, 0, 0] = [1, 1, 0, 1]; h = b * D = [1, 2, 0, 8], total 11,
    # cumulative [1, 3, 3, 11].
    [(9.0, 1.0), (20.0, 2.0), (27.0, 2.0), (28.0, 8.0), (60.0, 8.0), (100.0, 8.0)],
    ids=["p9", "p20", "p27", "p28", "p60", "p100"],
)
def test_s_pj_by_hand(level: float, expected: float) -> None:
    config = WindowConfig(half_life_ms=HL, percentiles=(level,))
    _, stats = feed(config, B, [(0, [2.0, 0.0, 0.0, 2.0]), (HL, [0.0, 1.0, 0.0, 0.0])])
    assert stats[f"p{level:g}"] == expected


def test_load_adjusted_differs_from_time_percentile_by_hand() -> None:
    decayed = np.array([1.0, 1.0, 0.0, 1.0])
    assert float(weighted_percentile(B, decayed, 60.0)) == 2.0  # counts: cumulative [1, 2, 2, 3]
    assert float(weighted_percentile(B, B * decayed, 60.0)) == 8.0


def test_s_max_covers_exactly_the_last_n_samples() -> None:
    config = WindowConfig(half_life_ms=HL, peak_samples=2)
    history = [(0, [0.0, 0.0, 0.0, 1.0]), (1, [0.0, 3.0, 0.0, 0.0])]
    assert feed(config, B, history)[1]["max"] == 8.0
    assert feed(config, B, [*history, (2, [5.0, 0.0, 0.0, 0.0])])[1]["max"] == 2.0
    # An empty window takes a slot but contributes no peak.
    assert feed(config, B, [*history, (2, [0.0] * 4)])[1]["max"] == 2.0
    assert np.isnan(feed(config, B, [*history, (2, [0.0] * 4), (3, [0.0] * 4)])[1]["max"])


def test_no_usage_gives_nan_statistics() -> None:
    _, stats = feed(WindowConfig(half_life_ms=HL), B, [(0, [0.0] * 4)])
    assert all(np.isnan(v) for v in stats.values())


def test_out_of_order_histograms_are_rejected() -> None:
    config = WindowConfig(half_life_ms=HL)
    state, _ = feed(config, B, [(1000, [1.0, 0, 0, 0])])
    with pytest.raises(ValueError):
        update_window(config, B, state, np.array([[1.0, 0, 0, 0]]), np.array([999]))
    with pytest.raises(ValueError):
        update_window(config, B, state, np.array([[1.0, 0, 0]]), np.array([2000]))


def test_batched_jobs_and_chunks_equal_one_job_at_a_time() -> None:
    rng = np.random.default_rng(7)
    config = WindowConfig(half_life_ms=HL, peak_samples=3)
    jobs, steps = 5, 6
    counts = rng.integers(0, 4, size=(steps, jobs, B.size)).astype(float)
    times = np.cumsum(rng.integers(1, HL, size=(steps, jobs)), axis=0)
    batch = initial_window_state(jobs, B.size, config)
    for step in range(steps):
        batch, batch_stats = update_window(config, B, batch, counts[step], times[step], chunk_jobs=2)
    for job in range(jobs):
        _, single = feed(config, B, [(int(times[s, job]), counts[s, job].tolist()) for s in range(steps)])
        for name, values in batch_stats.as_dict().items():
            assert values[job] == pytest.approx(single[name], nan_ok=True)
        scratch = statistics_from_history(config, B, counts[:, job], times[:, job])
        for name, values in scratch.as_dict().items():
            assert values[0] == pytest.approx(single[name], nan_ok=True)


def test_update_does_not_modify_the_old_state() -> None:
    config = WindowConfig(half_life_ms=HL)
    state = initial_window_state(1, B.size, config)
    before = state.to_bytes()
    update_window(config, B, state, np.array([[1.0, 2.0, 3.0, 4.0]]), np.array([5]))
    assert state.to_bytes() == before
