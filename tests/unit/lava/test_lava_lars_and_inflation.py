"""LARS migration order (LAVA §4.4, §5.1, §6.3) and stranding by inflation (§2.3)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lava_builders import HOUR, MINUTE, trace

from cellpilot.evaluate.lava_inflation import ShapeMix, inflate, shape_mix, stranding_pct
from cellpilot.schedule.lifetime_aware.lars import MigrationOrder, MigrationRequests, replay_migrations


def requests(exits_min: list[float], requested_min: list[float] | None = None) -> MigrationRequests:
    n = len(exits_min)
    exits = np.array(exits_min) * MINUTE
    return MigrationRequests(
        requested=np.array(requested_min or [0.0] * n) * MINUTE,
        exit=exits,
        predicted_exit=exits,  # an oracle
        trace_rank=np.arange(n, dtype=np.int64),
    )


@pytest.mark.parametrize(
    ("exits_min", "trace_order", "lars"),
    [
        # A exits at 15 min. Trace order migrates A, B, C at once, then D at 20 min: 4.
        # LARS starts B, C, D (longest first); at 20 min A has exited: 3.
        ([15.0, 6000.0, 6000.0, 6000.0], 4, 3),
        # A exits at 30 min: still there when LARS gets to it at 20 min.
        ([30.0, 6000.0, 6000.0, 6000.0], 4, 4),
        # Two short VMs last in trace order: they exit while the long ones move.
        ([6000.0, 6000.0, 6000.0, 10.0, 19.0], 3, 3),
        # Short VMs first in trace order cost migrations that LARS saves.
        ([10.0, 19.0, 6000.0, 6000.0, 6000.0], 5, 3),
    ],
    ids=["saves-one", "too-slow", "already-last", "saves-two"],
)
def test_replay_by_hand(exits_min: list[float], trace_order: int, lars: int) -> None:
    r = requests(exits_min)
    assert replay_migrations(r, MigrationOrder.TRACE).migrated == trace_order
    assert replay_migrations(r, MigrationOrder.LARS).migrated == lars


def test_slots_wait_for_later_requests() -> None:
    # One slot: the second request arrives at 60 min, after the first migration finished.
    r = requests([1000.0, 1000.0], [0.0, 60.0])
    out = replay_migrations(r, MigrationOrder.TRACE, slots=1)
    assert (out.migrated, out.exited_first) == (2, 0)
    # A VM requested after it exited needs no migration.
    out = replay_migrations(requests([1000.0, 30.0], [0.0, 60.0]), MigrationOrder.TRACE)
    assert (out.migrated, out.exited_first) == (1, 1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 300), st.floats(0, 600)), min_size=0, max_size=25),
    st.integers(1, 4),
    st.sampled_from(list(MigrationOrder)),
)
def test_every_request_is_migrated_or_exited(
    pairs: list[tuple[float, float]], slots: int, order: MigrationOrder
) -> None:
    requested = [a for a, _ in pairs]
    exits = [a + b for a, b in pairs]
    out = replay_migrations(requests(exits, requested), order, slots=slots)
    assert out.migrated + out.exited_first == out.requested == len(pairs)


def test_inflation_by_hand() -> None:
    # One host with 4 cores and 32 GiB free; the only shape is 2 cores / 4 GiB: two fit,
    # leaving 0 cores and 24 GiB stranded.
    free = np.array([[4.0, 32.0, 0.0]])
    capacity = np.array([[10.0, 40.0, 100.0]])
    mix = ShapeMix(np.array([[2.0, 4.0, 0.0]]), np.array([1.0]))
    np.testing.assert_allclose(inflate(free, capacity, mix, np.random.default_rng(0)), [[0.0, 24.0, 0.0]])
    pct = stranding_pct(free, capacity, mix, np.random.default_rng(0))
    np.testing.assert_allclose(pct, [0.0, 60.0, 0.0])


def test_inflation_uses_every_shape_that_still_fits() -> None:
    # A big and a small shape: whatever the draws, the end state fits neither.
    free = np.array([[7.0, 7.0, 0.0], [3.0, 30.0, 0.0]])
    capacity = np.array([[10.0, 40.0, 0.0]] * 2)
    mix = ShapeMix(np.array([[4.0, 4.0, 0.0], [1.0, 2.0, 0.0]]), np.array([5.0, 1.0]))
    for seed in range(5):
        left = inflate(free, capacity, mix, np.random.default_rng(seed))
        for shape in mix.shapes:
            assert not np.any(np.all(left >= shape, axis=1))
        assert np.all(left >= 0)


def test_shape_mix_weights_by_vm_hours() -> None:
    t = trace(
        [(0.0, 2 * HOUR, 2.0, 4.0), (0.0, 1 * HOUR, 2.0, 4.0), (0.0, 1 * HOUR, 8.0, 16.0)], horizon=10 * HOUR
    )
    mix = shape_mix(t)
    np.testing.assert_allclose(mix.shapes, [[2.0, 4.0, 0.0], [8.0, 16.0, 0.0]])
    np.testing.assert_allclose(mix.weights, [3.0, 1.0])


def test_shape_mix_validation() -> None:
    with pytest.raises(ValueError):
        ShapeMix(np.zeros((0, 3)), np.zeros(0))
    with pytest.raises(ValueError):
        ShapeMix(np.array([[1.0, 1.0, 0.0]]), np.array([0.0]))
