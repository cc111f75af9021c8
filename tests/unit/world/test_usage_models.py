"""Usage models for simulated tasks (cellpilot.world.usage_models).

Noise-free parameters make each model's shape checkable against its formula by hand;
noisy ones are checked for their statistics and for event-time purity (the value at one
task and second never depends on what else is evaluated).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.world.usage_models import (
    USAGE_MODELS,
    evaluate_usage,
    model_names,
    model_parameters,
    resolve_params,
)

MIB = 1 << 20
T0 = 1_700_000_000.0  # an event time in seconds since the epoch


def test_all_the_required_models_exist() -> None:
    assert {"steady", "diurnal", "step", "leak", "spiky", "batch"} <= set(model_names())
    for name in model_names():
        for parameter in model_parameters(name).values():
            assert parameter.unit
            assert parameter.doc


@pytest.mark.parametrize("name", sorted(USAGE_MODELS), ids=sorted(USAGE_MODELS))
def test_shapes_dtypes_and_broadcasting(name: str) -> None:
    cpu, memory = evaluate_usage(name, {}, 3, np.arange(7), T0 + np.arange(5)[:, None], T0 - 60)
    assert cpu.shape == memory.shape == (5, 7)
    assert cpu.dtype == np.float64
    assert memory.dtype == np.int64
    assert (cpu >= 0).all()
    assert (memory >= 0).all()
    scalar_cpu, scalar_memory = evaluate_usage(name, {}, 3, 4, T0 + 2, T0 - 60)
    assert scalar_cpu.shape == ()
    assert float(scalar_cpu) == cpu[2, 4]
    assert int(scalar_memory) == memory[2, 4]


@pytest.mark.parametrize("name", sorted(USAGE_MODELS), ids=sorted(USAGE_MODELS))
def test_values_do_not_depend_on_what_else_is_evaluated(name: str) -> None:
    times = T0 + np.arange(30.0)
    batch_cpu, batch_memory = evaluate_usage(name, {}, 11, np.arange(4), times[:, None], T0)
    for j in (29, 0, 17):  # any order
        for i in (3, 1):
            cpu, memory = evaluate_usage(name, {}, 11, i, times[j], T0)
            assert float(cpu) == batch_cpu[j, i]
            assert int(memory) == batch_memory[j, i]


def test_seed_plus_index_is_the_key() -> None:
    # Task i under seed s is task i - 1 under seed s + 1 (SimulatedRuntime: task i uses seed + i).
    a = evaluate_usage("spiky", {}, 10, 5, T0 + np.arange(20.0))
    b = evaluate_usage("spiky", {}, 11, 4, T0 + np.arange(20.0))
    c = evaluate_usage("spiky", {}, 10, 6, T0 + np.arange(20.0))
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


def test_steady_without_noise_is_exactly_the_level() -> None:
    params = {"cpu_millicores": 750, "cpu_noise": 0, "memory_bytes": 300 * MIB, "memory_noise": 0}
    cpu, memory = evaluate_usage("steady", params, 1, np.arange(3), T0 + np.arange(10.0)[:, None])
    assert (cpu == 750).all()
    assert (memory == 300 * MIB).all()


def test_steady_noise_has_the_stated_relative_spread() -> None:
    cpu, _ = evaluate_usage(
        "steady",
        {"cpu_millicores": 1000, "cpu_noise": 0.1},
        5,
        np.arange(200),
        T0 + np.arange(200.0)[:, None],
    )
    assert cpu.mean() == pytest.approx(1000, rel=0.01)
    assert cpu.std() == pytest.approx(100, rel=0.05)
    # Per-second noise: consecutive seconds differ, the same second repeats.
    assert cpu[0, 0] != cpu[1, 0]


def test_diurnal_peaks_at_the_peak_and_bottoms_half_a_period_later() -> None:
    params = {
        "cpu_mean_millicores": 1000,
        "cpu_amplitude": 0.4,
        "memory_mean_bytes": 100 * MIB,
        "memory_amplitude": 0.1,
        "period_seconds": 86_400,
        "peak_seconds": 50_400,
        "cpu_noise": 0,
        "memory_noise": 0,
    }
    day = 86_400.0 * 19_000  # a midnight (UTC)
    cpu, memory = evaluate_usage("diurnal", params, 0, 0, np.array([day + 50_400, day + 50_400 + 43_200]))
    assert cpu.tolist() == pytest.approx([1400.0, 600.0])
    assert memory.tolist() == [round(110 * MIB), round(90 * MIB)]
    whole_day, _ = evaluate_usage("diurnal", params, 0, 0, day + np.arange(0, 86_400, 60.0))
    assert whole_day.mean() == pytest.approx(1000.0, rel=1e-6)


def test_step_moves_from_before_to_after_at_the_given_age_within_the_rollout() -> None:
    params = {
        "cpu_before_millicores": 100,
        "cpu_after_millicores": 300,
        "memory_before_bytes": 10 * MIB,
        "memory_after_bytes": 20 * MIB,
        "step_after_seconds": 600,
        "rollout_seconds": 100,
        "cpu_noise": 0,
        "memory_noise": 0,
    }
    ages = np.arange(0, 1000.0)
    cpu, memory = evaluate_usage("step", params, 7, np.arange(50), T0 + ages[:, None], T0)
    assert set(np.unique(cpu)) == {100.0, 300.0}
    for task in range(50):
        step_at = ages[np.argmax(cpu[:, task] == 300.0)]
        assert 600 <= step_at <= 700
        assert (cpu[ages >= step_at, task] == 300).all()
        assert (cpu[ages < step_at, task] == 100).all()
        assert (memory[ages >= step_at, task] == 20 * MIB).all()
    firsts = {float(ages[np.argmax(cpu[:, t] == 300.0)]) for t in range(50)}
    assert len(firsts) > 10  # a rolling roll-out: staggered, not all at once


def test_leak_grows_linearly_with_age_up_to_the_cap() -> None:
    params = {
        "memory_start_bytes": 100 * MIB,
        "leak_bytes_per_second": 1 * MIB,
        "memory_max_bytes": 150 * MIB,
    }
    ages = np.array([0.0, 10.0, 49.0, 50.0, 500.0])
    _, memory = evaluate_usage("leak", params, 0, 0, T0 + 1000 + ages, T0 + 1000)
    assert memory.tolist() == [100 * MIB, 110 * MIB, 149 * MIB, 150 * MIB, 150 * MIB]
    # Before its start a task's age counts as 0.
    _, early = evaluate_usage("leak", params, 0, 0, T0, T0 + 1000)
    assert int(early) == 100 * MIB


def test_batch_ramps_memory_then_holds() -> None:
    params = {"memory_start_bytes": 0, "memory_peak_bytes": 1000 * MIB, "ramp_seconds": 100, "cpu_noise": 0}
    _, memory = evaluate_usage("batch", params, 0, 0, T0 + np.array([0.0, 25.0, 100.0, 1000.0]), T0)
    assert memory.tolist() == [0, 250 * MIB, 1000 * MIB, 1000 * MIB]
    cpu, _ = evaluate_usage("batch", params, 0, 0, T0 + np.arange(5.0), T0)
    assert (cpu == USAGE_MODELS["batch"].params["cpu_millicores"].default).all()


def test_spiky_spikes_hold_for_whole_windows_at_the_stated_rate() -> None:
    params = {
        "cpu_base_millicores": 100,
        "cpu_noise_sigma": 0,
        "cpu_spike_millicores": 900,
        "spike_probability": 0.2,
        "spike_seconds": 10,
    }
    windows = 400
    start = 10.0 * 170_000_000  # window-aligned
    cpu, _ = evaluate_usage("spiky", params, 3, np.arange(20), start + np.arange(windows * 10.0)[:, None])
    assert set(np.unique(cpu)) == {100.0, 1000.0}
    per_window = cpu.reshape(windows, 10, 20)
    assert (per_window.min(axis=1) == per_window.max(axis=1)).all()  # constant within a window
    assert (per_window[:, 0, :] == 1000.0).mean() == pytest.approx(0.2, abs=0.02)


def test_task_spread_makes_tasks_differ_persistently() -> None:
    params = {"cpu_noise": 0, "memory_noise": 0, "task_spread": 0.3}
    cpu, _ = evaluate_usage("steady", params, 0, np.arange(500), T0 + np.arange(3.0)[:, None])
    assert (cpu[0] == cpu[2]).all()  # the same task keeps its size
    assert np.log(cpu[0] / 500.0).std() == pytest.approx(0.3, rel=0.15)
    assert cpu[0].mean() == pytest.approx(500.0, rel=0.05)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("nope", {}, "unknown usage model"),
        ("steady", {"cpu": 1.0}, "unknown parameter 'cpu'"),
        ("steady", {"cpu_millicores": -1.0}, "'cpu_millicores'.*>= 0"),
        ("diurnal", {"cpu_amplitude": 1.5}, "'cpu_amplitude'.*<= 1"),
        ("diurnal", {"period_seconds": 0.0}, "'period_seconds'.*> 0"),
        ("spiky", {"spike_probability": 2.0}, "'spike_probability'"),
        ("leak", {"leak_bytes_per_second": float("nan")}, "'leak_bytes_per_second'"),
    ],
    ids=[
        "unknown-model",
        "unknown-param",
        "negative",
        "amplitude-over-one",
        "zero-period",
        "probability",
        "nan",
    ],
)
def test_bad_parameters_are_named(name: str, params: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_params(name, params)


def test_resolve_fills_defaults_and_keeps_given_values() -> None:
    resolved = resolve_params("leak", {"leak_bytes_per_second": 5.0})
    assert resolved["leak_bytes_per_second"] == 5.0
    assert resolved["memory_start_bytes"] == model_parameters("leak")["memory_start_bytes"].default
    assert resolved["task_spread"] == 0.0


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(USAGE_MODELS)),
    seed=st.integers(0, 2**64 - 1),
    index=st.integers(0, 10_000),
    offset=st.floats(0, 1e7),
    noise=st.floats(0, 3),
)
def test_usage_is_never_negative_and_repeatable(
    name: str, seed: int, index: int, offset: float, noise: float
) -> None:
    params = {key: noise for key in model_parameters(name) if key.endswith("_noise")}
    first = evaluate_usage(name, params, seed, index, T0 + offset, T0)
    second = evaluate_usage(name, params, seed, index, T0 + offset, T0)
    assert float(first[0]) >= 0
    assert int(first[1]) >= 0
    assert float(first[0]) == float(second[0])
    assert int(first[1]) == int(second[1])
