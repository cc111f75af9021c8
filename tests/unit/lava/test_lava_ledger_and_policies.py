"""The lifetime ledger (repredictions) and best fit, LA-Binary and LAS over a pool (LAVA §2.4, §4.2, §5.3)."""

from __future__ import annotations

import numpy as np
import pytest
from lava_builders import HOUR, MINUTE, FixedPredictor, pool

from cellpilot.schedule.lifetime_aware.host_pool import HostPool, VmRequest
from cellpilot.schedule.lifetime_aware.lifetime_ledger import LifetimeLedger
from cellpilot.schedule.lifetime_aware.policies import placement_policy
from cellpilot.schedule.lifetime_aware.pool_placement import PoolPlacement


def ledger_with(lifetimes: list[float], created: list[float], hosts: int = 3, **kw: object) -> LifetimeLedger:
    return LifetimeLedger(FixedPredictor(lifetimes, **kw), np.array(created), hosts)  # type: ignore[arg-type]


def placement(name: str, p: HostPool, ledger: LifetimeLedger | None = None) -> PoolPlacement:
    return PoolPlacement(placement_policy(name), p, ledger)


def level_scores(placing: PoolPlacement, vm: VmRequest, candidates: np.ndarray, now: float) -> list[float]:
    """The policy's one level's scores (0-100) for ``vm``, as :meth:`PoolPlacement.choose` sees them."""
    assert placing.lifetimes is not None
    assert len(placing.levels) == 1
    placing.lifetimes.expect(vm, now)
    return placing.levels[0].job_scores(vm.row, candidates).tolist()


def place(ledger: LifetimeLedger, row: int, host: int, now: float) -> float:
    remaining = ledger.predict(row, now)
    ledger.attach(row, host)
    return remaining


def test_host_exit_is_the_latest_vm_exit() -> None:
    ledger = ledger_with([1 * HOUR, 5 * HOUR, 2 * HOUR], [0.0, 0.0, 0.0])
    place(ledger, 0, 0, 0.0)
    place(ledger, 1, 0, 0.0)
    place(ledger, 2, 1, 0.0)
    np.testing.assert_allclose(ledger.host_exit(), [5 * HOUR, 2 * HOUR, -np.inf])
    ledger.detach(1)
    np.testing.assert_allclose(ledger.host_exit(), [1 * HOUR, 2 * HOUR, -np.inf])


def test_a_vm_that_outlives_its_prediction_is_repredicted() -> None:
    # The predictor always says "1 h left": once the VM is past its predicted exit, a refresh moves it.
    ledger = ledger_with([1 * HOUR], [0.0])
    place(ledger, 0, 0, 0.0)
    assert ledger.exit[0] == 1 * HOUR
    assert ledger.refresh(30 * MINUTE) == 1  # min_step (10 min) re-evaluations happen early on
    assert ledger.exit[0] == 30 * MINUTE + HOUR
    ledger.refresh(3 * HOUR)
    assert ledger.exit[0] == 4 * HOUR
    assert ledger.first_exit[0] == 1 * HOUR  # the one-shot prediction never moves
    np.testing.assert_allclose(ledger.host_first_exit()[0], 1 * HOUR)


def test_reevaluation_waits_for_uptime_growth() -> None:
    ledger = ledger_with([100 * HOUR], [0.0])
    predictor = ledger.predictor
    place(ledger, 0, 0, 10 * HOUR)  # predicted at uptime 10 h (plus the one-shot at 0)
    assert ledger.refresh(12 * HOUR) == 0  # uptime grew 20 % < 25 %
    assert ledger.refresh(12.6 * HOUR) == 1
    assert predictor.calls[-1] == ([0], [12.6 * HOUR])  # type: ignore[attr-defined]


def test_detached_vms_are_not_repredicted_and_oracles_never() -> None:
    ledger = ledger_with([HOUR], [0.0])
    place(ledger, 0, 0, 0.0)
    ledger.detach(0)
    assert ledger.refresh(10 * HOUR) == 0
    oracle_like = ledger_with([HOUR], [0.0], repredicts=False)
    place(oracle_like, 0, 0, 0.0)
    assert oracle_like.refresh(10 * HOUR) == 0


def test_best_fit_picks_the_fullest_feasible_host() -> None:
    p = pool(3)
    p.place(0, 100, np.array([6.0, 6.0, 0.0]))
    p.place(1, 101, np.array([3.0, 30.0, 0.0]))
    vm = VmRequest(0, np.array([2.0, 4.0, 0.0]))
    candidates = np.flatnonzero(p.feasible(vm.demand))
    # Left over: host 0: 0.2 + 0.75 = 0.95; host 1: 0.5 + 0.15 = 0.65; host 2: 0.8 + 0.9.
    assert placement("best-fit", p).choose(vm, candidates, 0.0) == 1


def test_las_prefers_a_host_that_outlives_the_vm_over_a_fuller_one() -> None:
    p = pool(3)
    ledger = ledger_with([1 * HOUR, 50 * HOUR, 20 * HOUR], [0.0, 0.0, 0.0])
    for row, host, demand in [(0, 0, 8.0), (1, 1, 4.0)]:
        p.place(host, row, np.array([demand, 4.0, 0.0]))
        place(ledger, row, host, 0.0)
    las = placement("las", p, ledger)
    vm = VmRequest(2, np.array([1.0, 1.0, 0.0]), ledger.predict(2, 0.0))
    candidates = np.arange(3)
    # Host 0 is fuller but exits at 1 h (dT = 19 h, cost 8); host 1 exits at 50 h (cost 0); the
    # empty host "exits" now, so dT is the whole 20 h (cost 8). Score: 100 (1 - cost / 10).
    np.testing.assert_allclose(level_scores(las, vm, candidates, 0.0), [20.0, 100.0, 20.0])
    assert las.choose(vm, candidates, 0.0) == 1


def test_las_ties_inside_a_bucket_go_to_best_fit() -> None:
    p = pool(2)
    ledger = ledger_with([10 * HOUR, 10 * HOUR + 10 * MINUTE, 10 * HOUR + 20 * MINUTE], [0.0] * 3)
    for row, host, demand in [(0, 0, 2.0), (1, 1, 6.0)]:
        p.place(host, row, np.array([demand, 4.0, 0.0]))
        place(ledger, row, host, 0.0)
    vm = VmRequest(2, np.array([1.0, 1.0, 0.0]), ledger.predict(2, 0.0))
    # dT = 20 min and 10 min: both in the [0, 30 min) bucket; host 1 is fuller.
    assert placement("las", p, ledger).choose(vm, np.arange(2), 0.0) == 1


@pytest.mark.parametrize(
    ("vm_lifetime", "expected"),
    [(30 * MINUTE, 0), (5 * HOUR, 1)],
    ids=["short-vm-to-short-host", "long-vm-to-long-host"],
)
def test_la_binary_matches_short_and_long(vm_lifetime: float, expected: int) -> None:
    p = pool(3)
    ledger = ledger_with([1 * HOUR, 10 * HOUR, vm_lifetime], [0.0, 0.0, 0.0])
    for row, host in [(0, 0), (1, 1)]:
        p.place(host, row, np.array([5.0, 5.0, 0.0]))
        place(ledger, row, host, 0.0)
    vm = VmRequest(2, np.array([1.0, 1.0, 0.0]), ledger.predict(2, 0.0))
    la = placement("la-binary", p, ledger)
    assert la.choose(vm, np.arange(3), 0.0) == expected
    scores = level_scores(la, vm, np.arange(3), 0.0)
    assert scores[expected] == 100.0  # rank 0: a non-empty host of the VM's class
    assert scores[2] == 0.0  # rank 2: the empty host comes last


def test_la_binary_keeps_one_shot_predictions() -> None:
    # Host 0's VM was predicted 1 h at creation; at 3 h it is still there. LA still calls the host
    # short-lived (its initial prediction says it has exited); LAS's reprediction says 1 h more.
    p = pool(2)
    ledger = ledger_with([1 * HOUR, 5 * HOUR], [0.0, 3 * HOUR])
    p.place(0, 0, np.array([5.0, 5.0, 0.0]))
    place(ledger, 0, 0, 0.0)
    now = 3 * HOUR
    ledger.refresh(now)
    vm = VmRequest(1, np.array([1.0, 1.0, 0.0]), ledger.predict(1, now))
    # Long VM, "short" host: rank 1 (score 50); the empty host rank 2 (score 0).
    assert level_scores(placement("la-binary", p, ledger), vm, np.arange(2), now) == [50.0, 0.0]
    assert ledger.host_exit()[0] == now + HOUR
