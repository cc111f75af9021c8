"""Usage models for simulated tasks: CPU and memory as pure functions of event time.

A simulated task (``SimulatedRuntime`` in ``job.proto``) does no work; its Borglet asks a
model what the task uses at each event-second. Autopilot sees these raw samples r_i[τ]
(Autopilot §3.2.1: about one per second), so the models cover the shapes its recommenders
are built for: steady load, diurnal and weekly patterns of end-user-facing services (Borg
§2.1, Autopilot §2.2), a service growing in popularity (Autopilot §3.3), usage that steps
after a roll-out of a new binary (Autopilot §2.2: needs change "with new features,
optimizations and updates"), a slow memory leak (Autopilot §4.1 footnote 2), spiky CPU, and
batch tasks (Borg §2.1).

The same models describe a whole job's demand, shared among its ready tasks
(:mod:`cellpilot.world.job_demand`); a task's own model is then its base load.

Every model is ``(params, seed, task_index, t_seconds, start_seconds) -> (cpu_millicores,
memory_bytes)``, vectorised: ``task_index``, ``t_seconds`` and ``start_seconds`` broadcast
against each other (e.g. tasks ``(n,)`` against times ``(k, 1)`` gives ``(k, n)`` arrays).

* ``t_seconds`` is event time in seconds on the caller's axis (the Borglet passes seconds
  since the Unix epoch, so a diurnal peak lands at a time of day, in UTC);
* ``start_seconds`` is when the task started on the same axis; models that depend on a
  task's age (step, leak, growth, batch) use ``t_seconds - start_seconds``.

The value at one ``(seed, task, second)`` never depends on which other times were asked
for, or in which order: randomness is counter-based (a splitmix64 hash of the seed, the
task, a stream id and the whole event-second), not a stateful generator, so a replay, a
restarted Borglet and a batch evaluation all agree. Task ``i`` of a job uses key
``seed + i`` (as ``SimulatedRuntime.seed`` documents).

Parameters are plain floats by name (``SimulatedRuntime.params``); :data:`USAGE_MODELS`
documents each model's names, defaults and units, and :func:`resolve_params` rejects
unknown names and out-of-range values with a ``ValueError`` naming the parameter.
Parameters every model accepts:

* ``task_spread`` (fraction, default 0): per-task log-normal size factor with this sigma,
  so the tasks of one job differ persistently (drawn once per task key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.units import GIB, MIB

ArrayLike = npt.ArrayLike

DAY_SECONDS = 86_400.0

# Stream ids: independent random sequences for each purpose, so adding one never shifts another.
_CPU_NOISE, _MEMORY_NOISE, _TASK_SIZE, _PHASE, _SPIKE, _ROLLOUT = 1, 2, 3, 4, 5, 6

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The splitmix64 finaliser: a bijective, well-mixing hash of 64-bit words (wraps mod 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def _uniform(key: npt.NDArray[np.uint64], stream: int, step: npt.NDArray[np.int64]) -> FloatArray:
    """Uniform (0, 1) numbers keyed by (task key, stream, integer step); same inputs, same output."""
    with np.errstate(over="ignore"):
        h = _splitmix(key * _GOLDEN + np.uint64(stream))
        h = _splitmix(h ^ (step.astype(np.uint64) * _GOLDEN))
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


def _normal(key: npt.NDArray[np.uint64], stream: int, step: npt.NDArray[np.int64]) -> FloatArray:
    """Standard normal numbers keyed like :func:`_uniform` (Box–Muller on two keyed uniforms)."""
    # Normal streams draw on uniform streams 1000 + 2s and 1001 + 2s, apart from direct uniforms.
    u1 = _uniform(key, 1000 + 2 * stream, step)
    u2 = _uniform(key, 1001 + 2 * stream, step)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@dataclass(frozen=True)
class Inputs:
    """Broadcast inputs of one evaluation: task keys, event seconds and task ages."""

    key: npt.NDArray[np.uint64]  # seed + task index
    t: FloatArray  # event time, seconds
    age: FloatArray  # seconds since the task started (>= 0)
    second: Int64Array  # whole event-second, the step of the per-second noise

    @property
    def zeros(self) -> Int64Array:
        return np.zeros(self.key.shape, dtype=np.int64)


def _size_factor(params: Mapping[str, float], x: Inputs) -> FloatArray:
    spread = params["task_spread"]
    if spread == 0.0:
        return np.ones(x.key.shape)
    return np.asarray(np.exp(spread * _normal(x.key, _TASK_SIZE, x.zeros) - 0.5 * spread * spread))


def lognormal_factor(seed: int, task_index: ArrayLike, sigma: float) -> FloatArray:
    """The persistent per-task log-normal factor (mean 1, sigma ``sigma``) that ``task_spread``
    draws, for task keys ``seed + task_index``."""
    index = np.asarray(task_index, dtype=np.int64)
    if sigma == 0.0:
        return np.ones(index.shape)
    key = ((np.uint64(seed & 0xFFFFFFFFFFFFFFFF) + index.astype(np.uint64)) & _M64).astype(np.uint64)
    draw = _normal(np.asarray(key, dtype=np.uint64), _TASK_SIZE, np.zeros(index.shape, dtype=np.int64))
    return np.asarray(np.exp(sigma * draw - 0.5 * sigma * sigma))


def _noisy(level: FloatArray, relative_sd: float, x: Inputs, stream: int) -> FloatArray:
    """``level`` times (1 + sd * N(0, 1)) per event-second, never below zero."""
    if relative_sd == 0.0:
        return level
    return np.asarray(np.maximum(level * (1.0 + relative_sd * _normal(x.key, stream, x.second)), 0.0))


def _steady(p: Mapping[str, float], x: Inputs) -> tuple[FloatArray, FloatArray]:
    size = _size_factor(p, x)
    cpu = _noisy(p["cpu_millicores"] * size, p["cpu_noise"], x, _CPU_NOISE)
    memory = _noisy(p["memory_bytes"] * size, p["memory_noise"], x, _MEMORY_NOISE)
    return cpu, memory


def _diurnal(p: Mapping[str, float], x: Inputs) -> tuple[FloatArray, FloatArray]:
    size = _size_factor(p, x)
    jitter = p["phase_jitter_seconds"] * (_uniform(x.key, _PHASE, x.zeros) - 0.5)
    wave = np.cos(2.0 * np.pi * (x.t - p["peak_seconds"] - jitter) / p["period_seconds"])
    cpu_level = p["cpu_mean_millicores"] * size * (1.0 + p["cpu_amplitude"] * wave)
    cpu = _noisy(cpu_level, p["cpu_noise"], x, _CPU_NOISE)
    memory_level = p["memory_mean_bytes"] * size * (1.0 + p["memory_amplitude"] * wave)
    return cpu, _noisy(memory_level, p["memory_noise"], x, _MEMORY_NOISE)


def _weekly(p: Mapping[str, float], x: Inputs) -> tuple[FloatArray, FloatArray]:
    size = _size_factor(p, x)
    day = p["day_seconds"]
    wave = np.cos(2.0 * np.pi * (x.t - p["peak_seconds"]) / day)
    # Day 0 of the week (a Monday) starts at week_start_seconds; days 5 and 6 are the weekend.
    weekday = np.floor((x.t - p["week_start_seconds"]) / day).astype(np.int64) % 7
    level = np.where(weekday >= 5, p["weekend_factor"], 1.0) * size
    cpu = _noisy(
        p["cpu_mean_millicores"] * level * (1.0 + p["cpu_amplitude"] * wave), p["cpu_noise"], x, _CPU_NOISE
    )
    memory_level = p["memory_mean_bytes"] * level * (1.0 + p["memory_amplitude"] * wave)
    return cpu, _noisy(memory_level, p["memory_noise"], x, _MEMORY_NOISE)


def _growth(p: Mapping[str, float], x: Inputs) -> tuple[FloatArray, FloatArray]:
    size = _size_factor(p, x)
    days = x.age / DAY_SECONDS
    cpu_factor = 1.0 + p["cpu_growth_per_day"] * days
    memory_factor = 1.0 + p["memory_growth_per_day"] * days
    if p["max_factor"] > 0:
        cpu_factor = np.minimum(cpu_factor, p["max_factor"])
        memory_factor = np.minimum(memory_factor, p["max_factor"])
    cpu = _noisy(p["cpu_start_millicores"] * size * cpu_factor, p["cpu_noise"], x, _CPU_NOISE)
    memory = _noisy(p["memory_start_bytes"] * size * memory_factor, p["memory_noise"], x, _MEMORY_NOISE)
    return cpu, memory


def _step(p: Mapping[str, float], x: Inputs) -> tuple[FloatArray, FloatArray]:
    size = _size_factor(p, x)
    # A rolling roll-out reaches the tasks at staggered times within rollout_seconds.
    at = p["step_after_seconds"] + p["rollout_seconds"] * _uniform(x.key, _ROLLOUT, x.zeros)
    after = x.age >= at
    cpu_level = np.where(after, p["cpu_after_millicores"], p["cpu_before_millicores"]) * size
    memory_level = np.where(after, p["memory_after_bytes"], p["memory_before_bytes"]) * size
    cpu = _noisy(cpu_level, p["cpu_noise"], x, _CPU_NOISE)
    return cpu, _noisy(memory_level, p["memory_noise"], x, _MEMORY_NOISE)


def _leak(p: Mapping[str, float], x: Inputs) -> tuple[FloatArray, FloatArray]:
    size = _size_factor(p, x)
    memory_level = p["memory_start_bytes"] * size + p["leak_bytes_per_second"] * x.age
    if p["memory_max_bytes"] > 0:
        memory_level = np.minimum(memory_level, p["memory_max_bytes"])
    cpu = _noisy(p["cpu_millicores"] * size, p["cpu_noise"], x, _CPU_NOISE)
    return cpu, _noisy(memory_level, p["memory_noise"], x, _MEMORY_NOISE)


def _spiky(p: Mapping[str, float], x: Inputs) -> tuple[FloatArray, FloatArray]:
    size = _size_factor(p, x)
    # Log-normal per-second noise with median cpu_base_millicores, plus spikes that hold for
    # a whole window of spike_seconds with probability spike_probability per window.
    sigma = p["cpu_noise_sigma"]
    base = p["cpu_base_millicores"] * size * np.exp(sigma * _normal(x.key, _CPU_NOISE, x.second))
    window = np.floor(x.t / p["spike_seconds"]).astype(np.int64)
    spiking = _uniform(x.key, _SPIKE, window) < p["spike_probability"]
    cpu = base + np.where(spiking, p["cpu_spike_millicores"] * size, 0.0)
    return cpu, _noisy(p["memory_bytes"] * size, p["memory_noise"], x, _MEMORY_NOISE)


def _batch(p: Mapping[str, float], x: Inputs) -> tuple[FloatArray, FloatArray]:
    size = _size_factor(p, x)
    # CPU-bound work at a near-constant rate; the working set grows linearly to its peak over
    # ramp_seconds and then holds.
    ramp = p["ramp_seconds"]
    progress = np.ones(x.age.shape) if ramp == 0 else np.clip(x.age / ramp, 0.0, 1.0)
    start, peak = p["memory_start_bytes"], p["memory_peak_bytes"]
    memory_level = (start + (peak - start) * progress) * size
    cpu = _noisy(p["cpu_millicores"] * size, p["cpu_noise"], x, _CPU_NOISE)
    return cpu, _noisy(memory_level, p["memory_noise"], x, _MEMORY_NOISE)


@dataclass(frozen=True)
class Parameter:
    default: float
    unit: str
    doc: str
    minimum: float = 0.0
    positive: bool = False  # strictly above ``minimum``


@dataclass(frozen=True)
class UsageModel:
    name: str
    doc: str
    params: Mapping[str, Parameter]
    fn: Callable[[Mapping[str, float], Inputs], tuple[FloatArray, FloatArray]]


_COMMON = {"task_spread": Parameter(0.0, "sigma", "per-task log-normal size factor (persistent per task)")}


def _noise(kind: str, default: float) -> Parameter:
    return Parameter(default, "fraction", f"relative standard deviation of per-second {kind} noise")


USAGE_MODELS: dict[str, UsageModel] = {
    model.name: model
    for model in (
        UsageModel(
            "steady",
            "constant CPU and memory with per-second noise",
            {
                "cpu_millicores": Parameter(500.0, "millicores", "mean CPU"),
                "cpu_noise": _noise("CPU", 0.1),
                "memory_bytes": Parameter(256 * MIB, "bytes", "mean memory"),
                "memory_noise": _noise("memory", 0.01),
            },
            _steady,
        ),
        UsageModel(
            "diurnal",
            "a daily cosine around the mean, peaking at peak_seconds (time of day on the t axis)",
            {
                "cpu_mean_millicores": Parameter(1000.0, "millicores", "daily mean CPU"),
                "cpu_amplitude": Parameter(0.5, "fraction", "CPU swing as a fraction of the mean (<= 1)"),
                "memory_mean_bytes": Parameter(512 * MIB, "bytes", "daily mean memory"),
                "memory_amplitude": Parameter(0.1, "fraction", "memory swing (<= 1)"),
                "period_seconds": Parameter(DAY_SECONDS, "seconds", "period of the cycle", positive=True),
                "peak_seconds": Parameter(14 * 3600.0, "seconds", "offset of the peak within the period"),
                "phase_jitter_seconds": Parameter(0.0, "seconds", "per-task uniform shift of the peak"),
                "cpu_noise": _noise("CPU", 0.05),
                "memory_noise": _noise("memory", 0.01),
            },
            _diurnal,
        ),
        UsageModel(
            "weekly",
            "a daily cosine whose level drops to weekend_factor on days 5 and 6 of the week",
            {
                "cpu_mean_millicores": Parameter(1000.0, "millicores", "weekday mean CPU"),
                "cpu_amplitude": Parameter(
                    0.5, "fraction", "daily CPU swing as a fraction of the mean (<= 1)"
                ),
                "memory_mean_bytes": Parameter(512 * MIB, "bytes", "weekday mean memory"),
                "memory_amplitude": Parameter(0.1, "fraction", "daily memory swing (<= 1)"),
                "weekend_factor": Parameter(0.6, "fraction", "weekend level relative to a weekday"),
                "day_seconds": Parameter(DAY_SECONDS, "seconds", "length of a day", positive=True),
                "peak_seconds": Parameter(14 * 3600.0, "seconds", "offset of the daily peak"),
                # 1970-01-05, the first Monday on the Unix epoch axis.
                "week_start_seconds": Parameter(4 * DAY_SECONDS, "seconds", "t at which a week starts"),
                "cpu_noise": _noise("CPU", 0.05),
                "memory_noise": _noise("memory", 0.01),
            },
            _weekly,
        ),
        UsageModel(
            "growth",
            "usage grows linearly with age (a growing service), up to max_factor times its start",
            {
                "cpu_start_millicores": Parameter(500.0, "millicores", "CPU at age 0"),
                "cpu_growth_per_day": Parameter(0.1, "fraction/day", "CPU growth per day, of the start"),
                "memory_start_bytes": Parameter(256 * MIB, "bytes", "memory at age 0"),
                "memory_growth_per_day": Parameter(0.05, "fraction/day", "memory growth per day"),
                "max_factor": Parameter(0.0, "factor", "growth stops at this multiple; 0 = never"),
                "cpu_noise": _noise("CPU", 0.05),
                "memory_noise": _noise("memory", 0.01),
            },
            _growth,
        ),
        UsageModel(
            "step",
            "usage steps from a 'before' to an 'after' level step_after_seconds into the task's life",
            {
                "cpu_before_millicores": Parameter(500.0, "millicores", "CPU before the roll-out"),
                "cpu_after_millicores": Parameter(1000.0, "millicores", "CPU after the roll-out"),
                "memory_before_bytes": Parameter(256 * MIB, "bytes", "memory before the roll-out"),
                "memory_after_bytes": Parameter(512 * MIB, "bytes", "memory after the roll-out"),
                "step_after_seconds": Parameter(3600.0, "seconds", "task age at which the step happens"),
                "rollout_seconds": Parameter(0.0, "seconds", "per-task uniform extra delay (rolling)"),
                "cpu_noise": _noise("CPU", 0.05),
                "memory_noise": _noise("memory", 0.01),
            },
            _step,
        ),
        UsageModel(
            "leak",
            "memory grows linearly with the task's age (a leak), CPU steady",
            {
                "memory_start_bytes": Parameter(256 * MIB, "bytes", "memory at start"),
                "leak_bytes_per_second": Parameter(16 * 1024.0, "bytes/second", "growth rate"),
                "memory_max_bytes": Parameter(0.0, "bytes", "growth stops here; 0 = unbounded"),
                "cpu_millicores": Parameter(300.0, "millicores", "mean CPU"),
                "cpu_noise": _noise("CPU", 0.1),
                "memory_noise": _noise("memory", 0.0),
            },
            _leak,
        ),
        UsageModel(
            "spiky",
            "noisy log-normal CPU with occasional spikes held for spike_seconds; steady memory",
            {
                "cpu_base_millicores": Parameter(300.0, "millicores", "median CPU between spikes"),
                "cpu_noise_sigma": Parameter(0.3, "sigma", "log-normal sigma of per-second CPU"),
                "cpu_spike_millicores": Parameter(2000.0, "millicores", "extra CPU during a spike"),
                "spike_probability": Parameter(0.05, "probability", "chance a spike window spikes (<= 1)"),
                "spike_seconds": Parameter(10.0, "seconds", "length of a spike window", positive=True),
                "memory_bytes": Parameter(256 * MIB, "bytes", "mean memory"),
                "memory_noise": _noise("memory", 0.01),
            },
            _spiky,
        ),
        UsageModel(
            "batch",
            "CPU-bound work at a steady rate; memory ramps to its peak over ramp_seconds, then holds",
            {
                "cpu_millicores": Parameter(2000.0, "millicores", "mean CPU"),
                "cpu_noise": _noise("CPU", 0.05),
                "memory_start_bytes": Parameter(64 * MIB, "bytes", "memory at start"),
                "memory_peak_bytes": Parameter(1 * GIB, "bytes", "memory once the ramp is over"),
                "ramp_seconds": Parameter(600.0, "seconds", "length of the memory ramp; 0 = none"),
                "memory_noise": _noise("memory", 0.0),
            },
            _batch,
        ),
    )
}

_UPPER_BOUND_ONE = {"cpu_amplitude", "memory_amplitude", "spike_probability", "weekend_factor"}


def model_names() -> tuple[str, ...]:
    return tuple(USAGE_MODELS)


def model_parameters(name: str) -> dict[str, Parameter]:
    """Every parameter the model accepts (its own and the common ones), with defaults and units."""
    return {**USAGE_MODELS[_known_model(name)].params, **_COMMON}


def _known_model(name: str) -> str:
    if name not in USAGE_MODELS:
        raise ValueError(f"unknown usage model {name!r} (known: {', '.join(USAGE_MODELS)})")
    return name


def resolve_params(name: str, params: Mapping[str, float] | None = None) -> dict[str, float]:
    """The model's parameters with defaults filled in; a ``ValueError`` names any bad one."""
    known = model_parameters(name)
    resolved = {key: spec.default for key, spec in known.items()}
    for key, value in (params or {}).items():
        if key not in known:
            names = ", ".join(known)
            raise ValueError(f"unknown parameter {key!r} for usage model {name!r} (known: {names})")
        value = float(value)
        spec = known[key]
        if not np.isfinite(value) or value < spec.minimum or (spec.positive and value <= spec.minimum):
            bound = ">" if spec.positive else ">="
            raise ValueError(f"parameter {key!r} of usage model {name!r} must be {bound} {spec.minimum}")
        if key in _UPPER_BOUND_ONE and value > 1.0:
            raise ValueError(f"parameter {key!r} of usage model {name!r} must be <= 1")
        resolved[key] = value
    return resolved


def evaluate_usage(
    name: str,
    params: Mapping[str, float],
    seed: int,
    task_index: ArrayLike,
    t_seconds: ArrayLike,
    start_seconds: ArrayLike = 0.0,
) -> tuple[FloatArray, Int64Array]:
    """CPU (millicores, float) and memory (bytes, rounded) of tasks at event times.

    ``task_index``, ``t_seconds`` and ``start_seconds`` broadcast together; the outputs have
    the broadcast shape. Before a task's start its age counts as 0.
    """
    model = USAGE_MODELS[_known_model(name)]
    resolved = resolve_params(name, params)
    index, t, start = np.broadcast_arrays(
        np.asarray(task_index, dtype=np.int64),
        np.asarray(t_seconds, dtype=np.float64),
        np.asarray(start_seconds, dtype=np.float64),
    )
    key = (np.uint64(seed & 0xFFFFFFFFFFFFFFFF) + index.astype(np.uint64)) & _M64
    inputs = Inputs(
        key=np.asarray(key, dtype=np.uint64),
        t=np.asarray(t, dtype=np.float64),
        age=np.maximum(t - start, 0.0),
        second=np.floor(t).astype(np.int64),
    )
    cpu, memory = model.fn(resolved, inputs)
    cpu_out = np.maximum(np.asarray(cpu, dtype=np.float64), 0.0)
    memory_out = np.rint(np.maximum(np.asarray(memory, dtype=np.float64), 0.0)).astype(np.int64)
    return cpu_out, memory_out
