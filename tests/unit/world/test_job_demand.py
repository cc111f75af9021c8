"""A job's demand shared among its ready tasks (cellpilot.world.job_demand)."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.workloads.task_signals import JobSignals, JobTraits
from cellpilot.world.job_demand import DemandError, DemandSeries, JobDemand, job_task_demand, split_demand
from cellpilot.world.usage_models import evaluate_usage

T0 = 1_700_000_000.0
QUIET = {"cpu_noise": 0.0, "memory_noise": 0.0}


def _steady(cpu: float = 3000.0, memory: float = 600e6, imbalance: float = 0.0) -> JobDemand:
    return JobDemand.build(
        "steady", {"cpu_millicores": cpu, "memory_bytes": memory, **QUIET}, imbalance=imbalance, seed=7
    )


@pytest.mark.parametrize("imbalance", [0.0, 0.6], ids=["even", "imbalanced"])
def test_adding_ready_tasks_lowers_each_share_and_conserves_the_total(imbalance: float) -> None:
    demand = _steady(imbalance=imbalance)
    index = np.arange(8)
    previous_max = np.inf
    for ready in range(1, 9):
        routed = index < ready
        cpu, memory, unrouted = job_task_demand(demand, [T0], 0.0, index, routed)
        assert cpu[0].sum() == pytest.approx(3000.0)
        assert memory[0].sum() == pytest.approx(600e6)
        assert unrouted.tolist() == [0.0]
        assert (cpu[0, ~routed] == 0).all()
        if imbalance == 0.0:
            np.testing.assert_allclose(cpu[0, routed], 3000.0 / ready)
        # Every task that was routed before carries less once another joins.
        assert cpu[0, routed].max() < previous_max
        previous_max = cpu[0, routed].max()


def test_losing_a_ready_task_raises_the_others() -> None:
    demand = _steady()
    index = np.arange(4)
    before, _, _ = job_task_demand(demand, [T0], 0.0, index, [True, True, True, True])
    after, _, _ = job_task_demand(demand, [T0], 0.0, index, [True, False, True, True])
    np.testing.assert_allclose(before[0], [750.0] * 4)
    np.testing.assert_allclose(after[0], [1000.0, 0.0, 1000.0, 1000.0])


def test_with_no_task_routed_the_whole_demand_is_unrouted() -> None:
    cpu, _, unrouted = job_task_demand(_steady(), [T0, T0 + 1], 0.0, np.arange(3), [False, False, False])
    assert (cpu == 0).all()
    np.testing.assert_allclose(unrouted, [3000.0, 3000.0])


def test_borglets_that_each_see_their_own_tasks_split_the_job_consistently() -> None:
    # Five ready tasks, on two Borglets: each computes its own tasks' shares from the weights of
    # the routed tasks elsewhere (the balancer's view); together they take the whole demand.
    demand = _steady(imbalance=0.8)
    here, there = np.array([0, 3]), np.array([1, 2, 4])
    weights = demand.weights(np.arange(5))
    mine, _ = split_demand([3000.0], demand.weights(here), True, [weights.sum()])
    theirs, _ = split_demand([3000.0], demand.weights(there), True, [weights.sum()])
    whole, _ = split_demand([3000.0], weights, True)
    assert mine.sum() + theirs.sum() == pytest.approx(3000.0)
    np.testing.assert_allclose(np.concatenate([mine[0], theirs[0]]), whole[0, [0, 3, 1, 2, 4]])


def test_weights_are_persistent_per_task_and_even_without_imbalance() -> None:
    demand = _steady(imbalance=0.5)
    np.testing.assert_array_equal(demand.weights([0, 1, 2]), demand.weights([0, 1, 2]))
    assert demand.weights([5])[0] == demand.weights([3, 4, 5])[2]
    assert len(set(demand.weights(np.arange(10)).round(9).tolist())) == 10
    np.testing.assert_array_equal(_steady().weights(np.arange(4)), np.ones(4))


def test_the_job_demand_is_a_usage_model_under_the_jobs_own_key_with_age_from_its_origin() -> None:
    demand = JobDemand.build("leak", {"leak_bytes_per_second": 1000.0, **QUIET}, seed=3)
    cpu, memory = demand.total([T0 + 10.0, T0 + 20.0], origin_seconds=T0)
    expected_cpu, expected_memory = evaluate_usage(
        "leak", dict(demand.params), demand.key, 0, [T0 + 10, T0 + 20], T0
    )
    np.testing.assert_array_equal(cpu, expected_cpu)
    np.testing.assert_array_equal(memory, expected_memory)
    assert memory[1] - memory[0] == pytest.approx(10_000.0)


def test_a_diurnal_demand_split_among_more_tasks_at_the_peak() -> None:
    params = {"cpu_mean_millicores": 2000.0, "cpu_amplitude": 0.5, "period_seconds": 3600.0, **QUIET}
    demand = JobDemand.build("diurnal", {**params, "peak_seconds": 0.0}, seed=1)
    peak_cpu, _ = demand.total([T0 - T0 % 3600])
    trough_cpu, _ = demand.total([T0 - T0 % 3600 + 1800])
    assert peak_cpu[0] == pytest.approx(3000.0)
    assert trough_cpu[0] == pytest.approx(1000.0)


def test_a_trace_replays_point_by_point_from_the_origin_and_repeats() -> None:
    series = DemandSeries(300, np.array([100.0, 200.0, 300.0]), np.array([1.0, 2.0, 3.0]))
    demand = JobDemand.build(trace=series)
    cpu, memory = demand.total(T0 + np.array([-5.0, 0.0, 299.0, 300.0, 899.0, 900.0]), origin_seconds=T0)
    assert cpu.tolist() == [100.0, 100.0, 100.0, 200.0, 300.0, 100.0]
    assert memory.tolist() == [1.0, 1.0, 1.0, 2.0, 3.0, 1.0]


def test_a_traced_jobs_demand_is_the_sum_of_its_tasks_mean_usage() -> None:
    windows, tasks = 3, 2
    cpu = np.array([[0.5, 0.25], [1.0, np.nan], [0.1, 0.2]], dtype=np.float32)
    memory = np.array([[1e6, 2e6], [3e6, np.nan], [1e6, 1e6]], dtype=np.float32)
    limits = np.full((windows, tasks), 4e9, dtype=np.float32)
    job = JobSignals(
        job_id=1,
        traits=JobTraits(),
        memory_mean=memory,
        memory_peak=memory,
        cpu_mean=cpu,
        cpu_peak=cpu,
        memory_limit_hard=limits,
        memory_limit_soft=limits,
        cpu_limit=np.ones((windows, tasks), dtype=np.float32),
        restart=np.zeros((windows, tasks), dtype=bool),
        memory_leak_per_window=np.zeros(tasks, dtype=np.float32),
    )
    series = DemandSeries.from_job_signals(job)
    np.testing.assert_allclose(series.cpu_millicores, [750.0, 1000.0, 300.0], rtol=1e-6)
    np.testing.assert_allclose(series.memory_bytes, [3e6, 3e6, 2e6], rtol=1e-6)
    assert series.step_seconds == 300.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "usage_model"),
        ({"model": "nope"}, "usage_model"),
        ({"model": "steady", "params": {"cpu_milicores": 1.0}}, "params.cpu_milicores"),
        ({"model": "diurnal", "params": {"cpu_amplitude": 2.0}}, "params.cpu_amplitude"),
        ({"model": "steady", "imbalance": -1.0}, "imbalance"),
        ({"model": "steady", "trace": DemandSeries(60, np.ones(2), np.ones(2))}, "trace"),
    ],
    ids=["no-model", "unknown-model", "unknown-param", "bad-param", "bad-imbalance", "model-and-trace"],
)
def test_a_bad_demand_is_refused_naming_its_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(DemandError) as error:
        JobDemand.build(**kwargs)  # type: ignore[arg-type]
    assert error.value.field == field


@pytest.mark.parametrize(
    ("step", "cpu", "memory", "field"),
    [
        (0, [1.0], [], "step_seconds"),
        (60, [], [], "cpu_millicores"),
        (60, [1.0, -2.0], [], "cpu_millicores[1]"),
        (60, [1.0, float("nan")], [], "cpu_millicores[1]"),
        (60, [1.0, 2.0], [1.0], "memory_bytes"),
    ],
    ids=["no-step", "empty", "negative", "nan", "memory-length"],
)
def test_a_bad_trace_is_refused_naming_its_field(
    step: int, cpu: list[float], memory: list[float], field: str
) -> None:
    with pytest.raises(DemandError) as error:
        DemandSeries(step, np.array(cpu), np.array(memory))
    assert error.value.field == field


def test_weekly_demand_drops_at_the_weekend_and_growth_grows_with_age() -> None:
    weekly = {"cpu_mean_millicores": 1000.0, "cpu_amplitude": 0.0, "weekend_factor": 0.5, **QUIET}
    monday = 4 * 86_400.0 + 52 * 7 * 86_400.0
    cpu, _ = evaluate_usage("weekly", weekly, 0, 0, monday + 86_400.0 * np.arange(7) + 3600.0)
    assert cpu.tolist() == [1000.0] * 5 + [500.0] * 2
    growth = {"cpu_start_millicores": 100.0, "cpu_growth_per_day": 1.0, "max_factor": 3.0, **QUIET}
    cpu, _ = evaluate_usage("growth", growth, 0, 0, T0 + 86_400.0 * np.array([0.0, 1.0, 5.0]), T0)
    np.testing.assert_allclose(cpu, [100.0, 200.0, 300.0])
