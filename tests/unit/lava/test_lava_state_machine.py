"""LAVA's host states, lifetime classes, residual VMs, deadlines and preference order (LAVA §4.3)."""

from __future__ import annotations

import numpy as np
import pytest
from lava_builders import HOUR, FixedPredictor, pool

from cellpilot.schedule.lifetime_aware.host_pool import HostPool
from cellpilot.schedule.lifetime_aware.lava import (
    EMPTY,
    OPEN,
    RANK_EMPTY,
    RANK_NON_EMPTY,
    RANK_OPEN_SAME,
    RECYCLING,
    Lava,
    lava_ranks,
)
from cellpilot.schedule.lifetime_aware.lifetime_ledger import LifetimeLedger
from cellpilot.schedule.lifetime_aware.policies import VmRequest


class Harness:
    """A pool, a ledger with fixed predictions and LAVA, updated in the simulator's order."""

    def __init__(self, lifetimes_h: list[float], hosts: int = 3) -> None:
        self.pool: HostPool = pool(hosts)
        predictor = FixedPredictor([h * HOUR for h in lifetimes_h])
        self.ledger = LifetimeLedger(predictor, np.zeros(len(lifetimes_h)), hosts)  # type: ignore[arg-type]
        self.lava = Lava(self.pool, self.ledger)
        self.demand: dict[int, np.ndarray] = {}

    def request(self, row: int, cores: float, now: float) -> VmRequest:
        return VmRequest(row, np.array([cores, 1.0, 0.0]), self.ledger.predict(row, now))

    def choose(self, row: int, cores: float, now: float = 0.0) -> int:
        vm = self.request(row, cores, now)
        return self.lava.choose(vm, np.flatnonzero(self.pool.feasible(vm.demand)), now)


def put(h: Harness, row: int, host: int, cores: float, now: float = 0.0) -> None:
    vm = h.request(row, cores, now)
    h.demand[row] = vm.demand
    h.pool.place(host, row, vm.demand)
    h.ledger.attach(row, host)
    h.lava.placed(host, vm, now)


def drop(h: Harness, row: int, host: int, now: float) -> None:
    h.pool.remove(host, row, h.demand[row])
    h.ledger.detach(row)
    h.lava.removed(host, row, now)


def harness(lifetimes_h: list[float], hosts: int = 3) -> Harness:
    return Harness(lifetimes_h, hosts)


def test_an_empty_host_opens_with_the_vms_class_and_a_deadline() -> None:
    h = harness([50.0])  # 10-100 h: LC3 (class 2)
    put(h, 0, 1, 2.0, now=5.0)
    assert (h.lava.state[1], h.lava.host_class[1]) == (OPEN, 2)
    assert h.lava.deadline[1] == pytest.approx(5.0 + 1.1 * 100 * HOUR)
    assert h.lava.state[0] == EMPTY


def test_over_ninety_percent_turns_recycling_and_marks_residuals() -> None:
    h = harness([50.0, 50.0, 50.0])
    put(h, 0, 0, 5.0)
    put(h, 1, 0, 4.0)
    assert h.lava.state[0] == OPEN  # exactly 90 % is not over 90 %
    put(h, 2, 0, 0.5)
    assert h.lava.state[0] == RECYCLING
    assert h.lava.residuals[0] == 3
    assert h.lava.residual_on == {0: 0, 1: 0, 2: 0}


def test_residuals_leaving_drop_the_class_and_the_rest_become_residual() -> None:
    h = harness([500.0, 500.0, 5.0, 5.0])  # two LC4 residuals, then two LC2 gap fillers
    put(h, 0, 0, 5.0)
    put(h, 1, 0, 4.5)  # 95 %: recycling, rows 0 and 1 residual
    drop(h, 1, 0, now=HOUR)
    put(h, 2, 0, 0.3, now=HOUR)
    put(h, 3, 0, 0.3, now=HOUR)
    assert h.lava.host_class[0] == 3
    assert h.lava.residuals[0] == 1
    drop(h, 0, 0, now=2 * HOUR)  # the last residual leaves: LC4 -> LC3, rows 2 and 3 now residual
    assert h.lava.state[0] == RECYCLING
    assert h.lava.host_class[0] == 2
    assert h.lava.residuals[0] == 2
    assert h.lava.deadline[0] == pytest.approx(2 * HOUR + 1.1 * 100 * HOUR)
    assert h.lava.reclassified_down == 1
    drop(h, 2, 0, now=3 * HOUR)
    drop(h, 3, 0, now=3 * HOUR)
    assert (h.lava.state[0], h.lava.host_class[0], h.lava.residuals[0]) == (EMPTY, -1, 0)


def test_a_host_past_its_deadline_moves_up_a_class() -> None:
    h = harness([0.5, 0.5])  # LC1: deadline 1.1 h
    put(h, 0, 0, 1.0)
    put(h, 1, 0, 1.0, now=0.5 * HOUR)
    h.lava.advance(1.0 * HOUR)
    assert h.lava.host_class[0] == 0
    h.lava.advance(1.2 * HOUR)  # still occupied: underpredicted
    assert h.lava.host_class[0] == 1
    assert h.lava.residuals[0] == 2
    assert h.lava.deadline[0] == pytest.approx(1.2 * HOUR + 1.1 * 10 * HOUR)
    assert h.lava.reclassified_up == 1


def test_class_stays_within_lc1_and_lc4() -> None:
    h = harness([0.5, 0.1, 5000.0])
    put(h, 0, 0, 9.5)  # LC1 host, recycling at once
    put(h, 1, 0, 0.2)
    drop(h, 0, 0, now=0.2 * HOUR)  # residual left: class cannot go below LC1
    assert h.lava.host_class[0] == 0
    put(h, 2, 1, 1.0)
    h.lava.advance(2000 * HOUR)
    assert h.lava.host_class[1] == 3


@pytest.mark.parametrize(
    ("vm_class", "state", "host_class", "non_empty", "rank"),
    [
        (0, RECYCLING, 1, True, 0),
        (0, RECYCLING, 2, True, 1),
        (0, RECYCLING, 3, True, 2),
        (1, RECYCLING, 1, True, RANK_NON_EMPTY),  # not a shorter class: plain non-empty host
        (1, OPEN, 1, True, RANK_OPEN_SAME),
        (1, OPEN, 2, True, RANK_NON_EMPTY),
        (2, EMPTY, -1, False, RANK_EMPTY),
    ],
    ids=["recycling+1", "recycling+2", "recycling+3", "recycling-same", "open-same", "open-other", "empty"],
)
def test_preference_order(vm_class: int, state: int, host_class: int, non_empty: bool, rank: int) -> None:
    got = lava_ranks(vm_class, np.array([state]), np.array([host_class]), np.array([non_empty]))
    assert int(got[0]) == rank
    assert 0 <= int(got[0]) <= RANK_EMPTY


def test_choose_follows_the_order_before_best_fit() -> None:
    h = harness([500.0, 5.0, 5.0, 5.0], hosts=4)
    put(h, 0, 0, 9.5)  # host 0: recycling LC4 (9.5 of 10 cores)
    put(h, 1, 1, 2.0)  # host 1: open LC2, fuller than nothing else
    # A new LC2 VM prefers the recycling LC4 host (one class shorter fits its gaps) if it fits ...
    assert h.choose(2, 0.5) == 0
    # ... otherwise the open LC2 host, not an empty one.
    assert h.choose(3, 1.0) == 1
