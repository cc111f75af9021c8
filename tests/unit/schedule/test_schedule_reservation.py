"""Resource reclamation: reservations from usage (Borg §5.5), and the cell's bookkeeping of them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedule_builders import cell_of, machine, recomputed_totals, task

from cellpilot.schedule import ReclamationParams, next_reservation
from cellpilot.schedule.cell import RESERVATION

P = ReclamationParams(startup_s=300.0, safety_margin=0.1, decay_half_life_s=600.0)


@pytest.mark.parametrize(
    ("reservation", "limit", "usage", "started", "last", "now", "expected"),
    [
        # Start-up: the reservation stays at the limit for 300 s whatever the usage.
        (10.0, 10.0, 1.0, 0.0, 0.0, 299.0, 10.0),
        # One half-life after start-up the gap to usage*1.1 = 2.2 halves: 2.2 + 7.8 / 2.
        (10.0, 10.0, 2.0, 0.0, 0.0, 900.0, 6.1),
        # Two half-lives: a quarter of the gap is left.
        (10.0, 10.0, 2.0, 0.0, 0.0, 1500.0, 2.2 + 7.8 / 4),
        # Decay continues from the last update, not from start-up.
        (6.1, 10.0, 2.0, 0.0, 900.0, 1500.0, 2.2 + 3.9 / 2),
        # Usage above the reservation: jump straight to usage plus margin.
        (3.0, 10.0, 5.0, 0.0, 1000.0, 1001.0, 5.5),
        # ... but never above the limit.
        (3.0, 10.0, 9.9, 0.0, 1000.0, 1001.0, 10.0),
        # A reservation below the target (usage under it) climbs towards the target slowly.
        (2.0, 10.0, 1.95, 0.0, 1000.0, 1600.0, 2.145 - 0.145 / 2),
    ],
    ids=["startup", "one-half-life", "two-half-lives", "from-last-update", "usage-spike", "capped", "climb"],
)
def test_reservation_rule(
    reservation: float, limit: float, usage: float, started: float, last: float, now: float, expected: float
) -> None:
    got = next_reservation([reservation], [limit], [usage], started, last, now, P)
    assert float(got[0]) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.floats(0.0, 100.0),
    st.floats(0.0, 100.0),
    st.floats(0.0, 200.0),
    st.floats(0.0, 1e5),
    st.floats(0.0, 1e5),
)
def test_reservation_moves_towards_target_and_stays_in_bounds(
    reservation: float, limit: float, usage: float, elapsed: float, step: float
) -> None:
    reservation = min(reservation, limit)
    now = 300.0 + elapsed + step
    got = float(next_reservation([reservation], [limit], [usage], 0.0, 300.0 + elapsed, now, P)[0])
    target = min(limit, usage * 1.1)
    assert 0.0 <= got <= limit + 1e-9
    if usage > reservation:
        assert got >= min(usage * 1.1, limit) - 1e-9  # raised at once
    else:
        low, high = sorted((reservation, target))
        assert low - 1e-9 <= got <= high + 1e-9  # between where it was and the target


def test_cell_update_usage_keeps_machine_sums_consistent() -> None:
    cell = cell_of(machine("a"), machine("b"))
    handles = [cell.bind(task("j", i, priority=2 + i, cores=2, ram_gib=4), i % 2, now=0.0) for i in range(4)]
    usage = np.array([[500.0, 1 * 2**30, 0, 0]] * 4)
    cell.update_usage(handles, usage, now=10_000.0, params=P)
    np.testing.assert_allclose(cell.below[: cell.n_machines], recomputed_totals(cell))
    # 9 700 s of decay after start-up: 2 000 -> 550 + 1 450 * 2^(-9700 / 600) milli-cores.
    expected = 550.0 + 1450.0 * 2.0 ** (-9700.0 / 600.0)
    np.testing.assert_allclose(cell.t_amount[handles, RESERVATION][:, 0], expected, rtol=1e-9)


def test_small_reservation_moves_do_not_invalidate_cached_scores() -> None:
    cell = cell_of(machine("a", cores=100))
    cell.invalidation_tolerance = 0.02
    h = cell.bind(task("j", 0, priority=3, cores=10), 0, now=0.0)
    before = int(cell.version[0])
    # 10 cores -> 9.9 cores of reservation: 0.1 % of the machine, below the 2 % tolerance.
    cell.update_usage([h], [[9000.0, 2**30, 0, 0]], now=10**6, params=P)
    assert int(cell.version[0]) == before
    cell.update_usage([h], [[1000.0, 2**30, 0, 0]], now=2 * 10**6, params=P)
    assert int(cell.version[0]) > before
