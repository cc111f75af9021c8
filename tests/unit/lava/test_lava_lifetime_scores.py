"""LAS temporal cost, LAVA lifetime classes, best fit and lexicographic choice (LAVA §2.2, §4.2, §4.3)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.lifetimes.lifetime_classes import class_upper, lifetime_class
from cellpilot.schedule.lifetime_aware.lifetime_scores import best_fit_cost, lexicographic_min, temporal_cost

M = 60.0
H = 3600.0


@pytest.mark.parametrize(
    ("delta", "cost"),
    [
        (-5 * H, 0),
        (0.0, 0),
        (29 * M, 0),
        (30 * M, 1),
        (70 * M, 2),  # §4.2's worked example
        (90 * M, 3),
        (2 * H, 4),
        (3 * H, 5),
        (5 * H, 6),
        (6 * H, 7),
        (12 * H, 8),
        (23.9 * H, 8),
        (24 * H, 9),
        (167 * H, 9),
        (168 * H, 10),
        (5000 * H, 10),
    ],
    ids=lambda v: f"{v}",
)
def test_temporal_cost_buckets(delta: float, cost: int) -> None:
    host_exit = np.array([1000.0])
    assert temporal_cost(1000.0 + delta, host_exit)[0] == cost


@pytest.mark.parametrize(
    ("hours", "klass"),
    [(0.0, 0), (0.99, 0), (1.0, 1), (9.9, 1), (10.0, 2), (99.0, 2), (100.0, 3), (999.0, 3), (50_000.0, 3)],
    ids=["zero", "under-1h", "1h", "under-10h", "10h", "under-100h", "100h", "under-1000h", "beyond"],
)
def test_lifetime_classes(hours: float, klass: int) -> None:
    assert int(lifetime_class(hours * H)) == klass


def test_class_upper_bounds() -> None:
    assert [class_upper(c) / H for c in range(4)] == [1.0, 10.0, 100.0, 1000.0]
    assert class_upper(-1) == 0.0
    assert class_upper(7) == 1000.0 * H


def test_best_fit_prefers_the_fullest_host_and_ignores_unrequested_ssd() -> None:
    capacity = np.array([[10.0, 40.0, 100.0]] * 3)
    used = np.array([[8.0, 10.0, 0.0], [4.0, 30.0, 90.0], [0.0, 0.0, 0.0]])
    demand = np.array([1.0, 4.0, 0.0])
    cost = best_fit_cost(capacity, used, demand)
    # Left over (cores/10 + memory/40): host 0 0.1 + 0.65; host 1 0.5 + 0.15; host 2 0.9 + 0.9.
    np.testing.assert_allclose(cost, [0.75, 0.65, 1.8])
    with_ssd = best_fit_cost(capacity, used, np.array([1.0, 4.0, 5.0]))
    np.testing.assert_allclose(with_ssd, [0.75 + 0.95, 0.65 + 0.05, 1.8 + 0.95])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=12))
def test_lexicographic_min_is_the_smallest_tuple(rows: list[tuple[int, int, int]]) -> None:
    levels = [np.array([r[i] for r in rows]) for i in range(3)]
    expected = min(range(len(rows)), key=lambda i: (rows[i], i))
    assert lexicographic_min(levels) == expected


def test_lexicographic_min_needs_candidates() -> None:
    with pytest.raises(ValueError):
        lexicographic_min([])
    with pytest.raises(ValueError):
        lexicographic_min([np.zeros(0)])
