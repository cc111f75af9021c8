"""LAVA's host states, lifetime classes, residual VMs, deadlines and preference order (LAVA §4.3)."""

from __future__ import annotations

import numpy as np
import pytest
from lava_builders import HOUR, FixedPredictor, pool

from cellpilot.schedule.lifetime_aware.host_pool import HostPool, VmRequest
from cellpilot.schedule.lifetime_aware.lava import (
    EMPTY,
    OPEN,
    RANK_EMPTY,
    RANK_NON_EMPTY,
    RANK_OPEN_SAME,
    RECYCLING,
    LavaHosts,
    lava_ranks,
)
from cellpilot.schedule.lifetime_aware.lifetime_ledger import LifetimeLedger
from cellpilot.schedule.lifetime_aware.policies import placement_policy
from cellpilot.schedule.lifetime_aware.pool_placement import PoolPlacement


class Harness:
    """A pool, a ledger with fixed predictions and the LAVA policy, updated in the simulator's order."""

    def __init__(self, lifetimes_h: list[float], hosts: int = 3) -> None:
        self.pool: HostPool = pool(hosts)
        predictor = FixedPredictor([h * HOUR for h in lifetimes_h])
        self.ledger = LifetimeLedger(predictor, np.zeros(len(lifetimes_h)), hosts)  # type: ignore[arg-type]
        self.placement = PoolPlacement(placement_policy("lava"), self.pool, self.ledger)
        assert self.placement.hosts is not None  # the LAVA policy keeps LAVA's host states
        self.lava: LavaHosts = self.placement.hosts
        self.demand: dict[int, np.ndarray] = {}

    def request(self, row: int, cores: float, now: float) -> VmRequest:
        return VmRequest(row, np.array([cores, 1.0, 0.0]), self.ledger.predict(row, now))

    def choose(self, row: int, cores: float, now: float = 0.0) -> int:
        vm = self.request(row, cores, now)
        return self.placement.choose(vm, np.flatnonzero(self.pool.feasible(vm.demand)), now)


def put(h: Harness, row: int, host: int, cores: float, now: float = 0.0) -> None:
    vm = h.request(row, cores, now)
    h.demand[row] = vm.demand
    h.pool.place(host, row, vm.demand)
    h.ledger.attach(row, host)
    h.placement.placed(host, vm, now)


def drop(h: Harness, row: int, host: int, now: float) -> None:
    h.pool.remove(host, row, h.demand[row])
    h.ledger.detach(row)
    h.placement.removed(host, row, now)


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
    h = harness([0.5, 0.5])  # LC1: deadline 1.1 h after the last LC1 VM placed while open
    put(h, 0, 0, 1.0)
    put(h, 1, 0, 1.0, now=0.5 * HOUR)  # pushes the deadline to 0.5 + 1.1 h
    h.lava.advance(1.5 * HOUR)
    assert h.lava.host_class[0] == 0
    h.lava.advance(1.7 * HOUR)  # still occupied: underpredicted
    assert h.lava.host_class[0] == 1
    assert h.lava.residuals[0] == 2
    assert h.lava.deadline[0] == pytest.approx(1.7 * HOUR + 1.1 * 10 * HOUR)
    assert h.lava.reclassified_up == 1


# §4.3: "if all predictions are correct, the total lifetime of a host does not exceed 1.1x its
# original lifetime class". While a host is open it keeps taking VMs of its class, each of which
# may live to the class bound from its own placement, so the deadline runs from the last of them.
@pytest.mark.parametrize(
    ("placements", "deadline_h"),
    [
        ([(0, 0.5, 0.0)], 1.1),  # opened by an LC1 VM at 0: 1.1 h
        ([(0, 0.5, 0.0), (1, 0.5, 0.8)], 0.8 + 1.1),  # a second LC1 VM at 0.8 h extends it
        ([(0, 5.0, 0.0), (1, 5.0, 3.0)], 3.0 + 11.0),  # LC2 host, second LC2 VM at 3 h
        ([(0, 5.0, 0.0), (1, 0.5, 3.0)], 11.0),  # a shorter VM (fallback) does not extend it
        ([(0, 0.5, 0.0), (1, 50.0, 0.5)], 1.1),  # nor does a longer one: the deadline catches it
    ],
    ids=["open", "same-class-later", "lc2", "shorter-vm", "longer-vm"],
)
def test_open_host_deadline_runs_from_its_last_vm_of_its_class(
    placements: list[tuple[int, float, float]], deadline_h: float
) -> None:
    h = harness([life for _, life, _ in placements])
    for row, _, at in placements:
        put(h, row, 0, 1.0, now=at * HOUR)
    assert h.lava.state[0] == OPEN
    assert h.lava.deadline[0] == pytest.approx(deadline_h * HOUR)


@pytest.mark.parametrize(
    ("cores", "state_before", "state_after", "reclassified_up_open"),
    [
        ([1.0], OPEN, RECYCLING, 1),  # an open host that times out now has residuals: it recycles
        ([5.0, 4.5], RECYCLING, RECYCLING, 0),  # a recycling host stays recycling
    ],
    ids=["open", "recycling"],
)
def test_a_timed_out_host_recycles(
    cores: list[float], state_before: int, state_after: int, reclassified_up_open: int
) -> None:
    n = len(cores)
    h = harness([0.5] * n + [0.2])  # the last row: a short gap filler placed after the timeout
    for row, c in enumerate(cores):
        put(h, row, 0, c)
    assert h.lava.state[0] == state_before
    h.lava.advance(1.2 * HOUR)
    assert (h.lava.state[0], h.lava.host_class[0]) == (state_after, 1)
    assert h.lava.residuals[0] == n
    assert h.lava.reclassified_up_open == reclassified_up_open
    # Once its residuals leave, it steps down a class (Figure 5b), as any recycling host.
    put(h, n, 0, 0.1, now=1.3 * HOUR)
    for row in range(n):
        drop(h, row, 0, now=1.4 * HOUR)
    assert (h.lava.state[0], h.lava.host_class[0], h.lava.residuals[0]) == (RECYCLING, 0, 1)


def test_vm_class_from_the_predictor_overrides_the_class_of_the_mean() -> None:
    # A distribution predictor may class a VM by risk (VmRequest.lifetime_class) rather than by
    # its expected remaining lifetime; LAVA opens and ranks hosts by that class.
    h = harness([0.5])
    vm = VmRequest(0, np.array([1.0, 1.0, 0.0]), h.ledger.predict(0, 0.0), lifetime_class=2)
    h.pool.place(0, 0, vm.demand)
    h.ledger.attach(0, 0)
    h.placement.placed(0, vm, 0.0)
    assert h.lava.host_class[0] == 2
    assert vm.vm_class == 2
    assert VmRequest(1, vm.demand, 0.5 * HOUR).vm_class == 0


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
