"""A recommender worker's per-job state and its batched updates (Autopilot §3.1-§3.3); no I/O.

Per job the worker keeps one :class:`~cellpilot.autopilot.candidates.CandidateState` per
resource (every built-in vertical recommender, §3.2), the CPU-utilisation signal of
horizontal scaling (§3.3), the newest output row per resource (so a set can be published
once both resources of a window are in) and how far it has published.

Updates are batched across jobs: the k-th new window of every job in a poll batch is
folded in one vectorised :func:`~cellpilot.autopilot.candidates.update_candidates` call
on the stacked job arrays (:mod:`cellpilot.recommend.job_arrays`). A window whose end is
not after the job's last applied window end is skipped (the aggregator's outbox may
re-send one), so nothing is applied twice.

Values are in the bucket schemes' units: CPU in millicores, memory in bytes. A state saved
in format 1 held CPU in cores; it is scaled to millicores when read (:func:`_cpu_scaled`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray
from cellpilot.autopilot import array_bundle
from cellpilot.autopilot.candidates import (
    CandidateBatch,
    CandidateConfig,
    CandidateState,
    UsageSignalConfig,
    apply_oom,
    initial_candidate_state,
    initial_usage_signal,
    oom_bumped_value,
    update_candidates,
    update_usage_signal,
)
from cellpilot.job_vocabulary import HorizontalStatistic
from cellpilot.recommend.horizontal import CpuSourceState
from cellpilot.recommend.unmet_demand import RaiseForUnmetDemand
from cellpilot.units import MILLICORES_PER_CORE
from cellpilot.usage.buckets import Resource

NO_TIME = -1
RESOURCES = (Resource.CPU, Resource.MEMORY)
_FORMAT = 2  # CPU in millicores
_FORMAT_CPU_IN_CORES = 1


@dataclass(frozen=True)
class RecommenderConfig:
    """Every recommender's setup; defaults are the paper's (see :mod:`candidates`)."""

    cpu: CandidateConfig = field(default_factory=lambda: CandidateConfig.for_resource(Resource.CPU))
    memory: CandidateConfig = field(default_factory=lambda: CandidateConfig.for_resource(Resource.MEMORY))
    signal: UsageSignalConfig = field(default_factory=UsageSignalConfig)
    # §3.3: "statistics S: max or P95"; the horizon T defaults to 72 hours.
    usage_statistic: HorizontalStatistic = HorizontalStatistic.MAX
    horizon_ms: int = 72 * 3_600_000
    # Optional: raise CPU recommendations of jobs whose demand went unserved (off by default).
    unmet_demand: RaiseForUnmetDemand | None = None

    def for_resource(self, resource: Resource) -> CandidateConfig:
        return self.cpu if resource is Resource.CPU else self.memory


@dataclass(frozen=True)
class CandidateRow:
    """One job's output of every recommender for one resource (columns in its registry's order)."""

    time_ms: int
    value: FloatArray
    raw_value: FloatArray
    margin: FloatArray  # relative
    raised_by_window_max: npt.NDArray[np.bool_]
    ml_model: int
    ml_cost: float
    oom_bumped: bool

    @classmethod
    def of(cls, batch: CandidateBatch, row: int) -> CandidateRow:
        return cls(
            int(batch.time_ms[row]),
            batch.value[row].copy(),
            batch.raw_value[row].copy(),
            batch.margin[row].copy(),
            batch.raised_by_window_max[row].copy(),
            int(batch.ml_model[row]),
            float(batch.ml_cost[row]),
            bool(batch.oom_bumped[row]),
        )

    def arrays(self, prefix: str) -> dict[str, npt.NDArray[Any]]:
        return {
            f"{prefix}value": self.value,
            f"{prefix}raw": self.raw_value,
            f"{prefix}margin": self.margin,
            f"{prefix}raised": self.raised_by_window_max,
        }

    def meta(self) -> list[Any]:
        return [
            self.time_ms,
            self.ml_model,
            None if np.isnan(self.ml_cost) else self.ml_cost,
            self.oom_bumped,
        ]

    @classmethod
    def restore(cls, arrays: Mapping[str, npt.NDArray[Any]], prefix: str, meta: list[Any]) -> CandidateRow:
        time_ms, model, cost, oom = meta
        return cls(
            int(time_ms),
            arrays[f"{prefix}value"],
            arrays[f"{prefix}raw"],
            arrays[f"{prefix}margin"],
            arrays[f"{prefix}raised"].astype(bool),
            int(model),
            float("nan") if cost is None else float(cost),
            bool(oom),
        )


@dataclass(frozen=True)
class HorizontalSettings:
    """A job's CPU-utilisation source settings (§3.3): horizon T and statistic S (max or P95)."""

    horizon_ms: int
    statistic: HorizontalStatistic


@dataclass(frozen=True)
class RecommenderState:
    """Every recommender's state for one job, as a recommender worker keeps it: the candidate
    arrays of each resource, the §3.3 CPU signal and the newest output rows. Not the job's
    lifecycle state (that is :class:`cellpilot.borg.lifecycle.JobState`)."""

    cpu: CandidateState
    memory: CandidateState
    signal: CpuSourceState
    usage_statistic: float  # r_S (millicores) after the newest CPU window; NaN = none yet
    rows: Mapping[Resource, CandidateRow]  # newest output per resource
    published_end_ms: int = NO_TIME  # window end of the newest set published
    # The job's own §3.3 horizon T and statistic S (from its spec); None = the config's defaults.
    horizon: HorizontalSettings | None = None

    def candidates(self, resource: Resource) -> CandidateState:
        return self.cpu if resource is Resource.CPU else self.memory

    def last_end_ms(self, resource: Resource) -> int:
        return int(self.candidates(resource).last_end_ms[0])

    @property
    def complete_window_ms(self) -> int:
        """The newest window end both resources have applied (NO_TIME if none)."""
        return min(self.last_end_ms(r) for r in RESOURCES)

    def ready_to_publish(self) -> bool:
        """Both resources of a window newer than the last published one are in."""
        end = self.complete_window_ms
        return end != NO_TIME and end > self.published_end_ms and all(r in self.rows for r in RESOURCES)

    def to_bytes(self) -> bytes:
        arrays: dict[str, npt.NDArray[Any]] = {
            "cpu": np.frombuffer(self.cpu.to_bytes(), dtype=np.uint8),
            "memory": np.frombuffer(self.memory.to_bytes(), dtype=np.uint8),
            "signal": np.frombuffer(self.signal.to_bytes(), dtype=np.uint8),
        }
        rows_meta: dict[str, list[Any]] = {}
        for resource, row in self.rows.items():
            arrays.update(row.arrays(f"{resource.value}_"))
            rows_meta[resource.value] = row.meta()
        meta = {
            "format": _FORMAT,
            "usage_statistic": None if np.isnan(self.usage_statistic) else self.usage_statistic,
            "published_end_ms": self.published_end_ms,
            "rows": rows_meta,
            "horizon": None
            if self.horizon is None
            else [self.horizon.horizon_ms, self.horizon.statistic.value],
        }
        return array_bundle.pack(arrays, meta)

    @classmethod
    def from_bytes(cls, data: bytes) -> RecommenderState:
        arrays, meta = array_bundle.unpack(data)
        if meta.get("format") not in (_FORMAT, _FORMAT_CPU_IN_CORES):
            raise ValueError(f"unsupported recommender state format {meta.get('format')}")
        rows = {
            Resource(name): CandidateRow.restore(arrays, f"{name}_", row_meta)
            for name, row_meta in meta["rows"].items()
        }
        statistic = meta["usage_statistic"]
        horizon = meta.get("horizon")
        state = cls(
            cpu=CandidateState.from_bytes(arrays["cpu"].tobytes()),
            memory=CandidateState.from_bytes(arrays["memory"].tobytes()),
            signal=CpuSourceState.from_bytes(arrays["signal"].tobytes()),
            usage_statistic=float("nan") if statistic is None else float(statistic),
            rows=rows,
            published_end_ms=int(meta["published_end_ms"]),
            horizon=None
            if horizon is None
            else HorizontalSettings(int(horizon[0]), HorizontalStatistic(horizon[1])),
        )
        if meta["format"] == _FORMAT_CPU_IN_CORES:
            return _cpu_scaled(state, float(MILLICORES_PER_CORE))
        return state


def _cpu_scaled(state: RecommenderState, factor: float) -> RecommenderState:
    """The state with every CPU value (not the counts, indices and costs, which carry no unit)
    multiplied by ``factor``: the migration of a format-1 state, which held CPU in cores."""
    cpu = state.cpu
    scaled_cpu = replace(
        cpu,
        window=replace(cpu.window, avg_weighted_sum=cpu.window.avg_weighted_sum * factor),
        hour_max=tuple(replace(ring, values=ring.values * factor) for ring in cpu.hour_max),
        pending_oom_value=cpu.pending_oom_value * factor,
        values=cpu.values * factor,
    )
    rows = dict(state.rows)
    row = rows.get(Resource.CPU)
    if row is not None:
        rows[Resource.CPU] = replace(row, value=row.value * factor, raw_value=row.raw_value * factor)
    return replace(
        state,
        cpu=scaled_cpu,
        signal=replace(state.signal, sums=state.signal.sums * factor),
        usage_statistic=state.usage_statistic * factor,
        rows=rows,
    )


def initial_recommender_state(config: RecommenderConfig) -> RecommenderState:
    return RecommenderState(
        cpu=initial_candidate_state(config.cpu),
        memory=initial_candidate_state(config.memory),
        signal=initial_usage_signal(config.signal),
        usage_statistic=float("nan"),
        rows={},
    )


@dataclass(frozen=True)
class HistogramInput:
    """One job histogram s[t] (§3.2.1) from ``usage.histograms``, in scheme units."""

    job_id: str
    resource: Resource
    end_ms: int
    counts: FloatArray  # (K,) dense counts in the resource's scheme
    mean_total_usage: float  # sum over tasks of their mean usage (millicores or bytes)
    mean_total_unmet: float = 0.0  # CPU: likewise of their unmet demand (millicores)


@dataclass(frozen=True)
class OomInput:
    """An OOM kill of one of the job's tasks: the limit it exceeded and its usage then (bytes)."""

    job_id: str
    time_ms: int
    limit_bytes: float
    usage_bytes: float


@dataclass
class ApplyResult:
    applied: int = 0
    skipped: int = 0  # not newer than what the job's state already holds
    changed: set[str] = field(default_factory=set)  # jobs whose state changed
    # (job, window end, state) for each window both resources completed, in event-time order
    ready: list[tuple[str, int, RecommenderState]] = field(default_factory=list)


def _rounds(inputs: Sequence[HistogramInput]) -> list[list[HistogramInput]]:
    """Round k holds each job's k-th window (both resources; event-time order): one step each."""
    per_job: dict[str, dict[int, list[HistogramInput]]] = defaultdict(lambda: defaultdict(list))
    for item in inputs:
        per_job[item.job_id][item.end_ms].append(item)
    rounds: list[list[HistogramInput]] = []
    for windows in per_job.values():
        for k, end in enumerate(sorted(windows)):
            if k == len(rounds):
                rounds.append([])
            rounds[k].extend(windows[end])
    return rounds


def _apply_resource(
    config: RecommenderConfig,
    states: dict[str, RecommenderState],
    resource: Resource,
    items: Sequence[HistogramInput],
    result: ApplyResult,
) -> None:
    """One vectorised step of one resource for jobs with at most one window each in ``items``."""
    fresh: list[HistogramInput] = []
    for item in items:
        state = states.get(item.job_id) or initial_recommender_state(config)
        states[item.job_id] = state
        if item.end_ms <= state.last_end_ms(resource):
            result.skipped += 1
        else:
            fresh.append(item)
    if not fresh:
        return
    jobs = [h.job_id for h in fresh]
    stacked = CandidateState.concat([states[j].candidates(resource) for j in jobs])
    counts = np.stack([h.counts for h in fresh])
    ends = np.asarray([h.end_ms for h in fresh], dtype=np.int64)
    new_stacked, batch = update_candidates(config.for_resource(resource), stacked, counts, ends)
    if resource is Resource.CPU and config.unmet_demand is not None:
        usage = [h.mean_total_usage for h in fresh]
        raised, _ = config.unmet_demand.apply(batch.value, usage, [h.mean_total_unmet for h in fresh])
        batch = replace(batch, value=raised)
    if resource is Resource.CPU:
        signals = CpuSourceState.concat([states[j].signal for j in jobs])
        new_signals, r_s = update_usage_signal(
            config.signal,
            signals,
            np.asarray([h.mean_total_usage for h in fresh]),
            ends,
            [_horizon(config, states[j]).horizon_ms for j in jobs],
            [_horizon(config, states[j]).statistic.value for j in jobs],
        )
    for row, job_id in enumerate(jobs):
        state = states[job_id]
        updated = new_stacked.take([row])
        rows = {**state.rows, resource: CandidateRow.of(batch, row)}
        if resource is Resource.CPU:
            state = replace(
                state,
                cpu=updated,
                signal=new_signals.take([row]),
                usage_statistic=float(r_s[row]),
                rows=rows,
            )
        else:
            state = replace(state, memory=updated, rows=rows)
        states[job_id] = state
        result.changed.add(job_id)
    result.applied += len(fresh)


def _horizon(config: RecommenderConfig, state: RecommenderState) -> HorizontalSettings:
    return state.horizon or HorizontalSettings(config.horizon_ms, config.usage_statistic)


def apply_horizontal_settings(
    config: RecommenderConfig, states: dict[str, RecommenderState], settings: Mapping[str, HorizontalSettings]
) -> set[str]:
    """Record each job's own horizon and statistic (its spec, as the Borgmaster announced it);
    r_S is taken over them from the next window on. Returns the jobs whose settings changed."""
    changed = set()
    for job_id, horizon in settings.items():
        state = states.get(job_id) or initial_recommender_state(config)
        if state.horizon != horizon:
            states[job_id] = replace(state, horizon=horizon)
            changed.add(job_id)
    return changed


def apply_histograms(
    config: RecommenderConfig, states: dict[str, RecommenderState], inputs: Sequence[HistogramInput]
) -> ApplyResult:
    """Fold job histograms into ``states`` (updated in place; unknown jobs start fresh).

    Every window whose two resources are both in becomes one entry of ``result.ready``
    (and the job's ``published_end_ms`` moves to it): one recommendation set per window.
    """
    result = ApplyResult()
    for round_inputs in _rounds(inputs):
        for resource in RESOURCES:
            _apply_resource(
                config, states, resource, [h for h in round_inputs if h.resource is resource], result
            )
        for job_id in dict.fromkeys(h.job_id for h in round_inputs):
            state = states[job_id]
            if state.ready_to_publish():
                end = state.complete_window_ms
                state = replace(state, published_end_ms=end)
                states[job_id] = state
                result.ready.append((job_id, end, state))
    return result


def apply_ooms(
    config: RecommenderConfig, states: dict[str, RecommenderState], ooms: Sequence[OomInput]
) -> set[str]:
    """React to OOM kills (§3.2, Figure 9a): every memory recommender's value rises at once.

    Returns the jobs whose recommendations changed. One vectorised step per round of OOMs
    (a job with two OOMs in the batch takes two rounds).
    """
    changed: set[str] = set()
    pending = list(ooms)
    while pending:
        seen: set[str] = set()
        this_round: list[OomInput] = []
        later: list[OomInput] = []
        for oom in pending:
            (later if oom.job_id in seen else this_round).append(oom)
            seen.add(oom.job_id)
        pending = later
        jobs = [o.job_id for o in this_round]
        for job_id in jobs:
            states.setdefault(job_id, initial_recommender_state(config))
        stacked = CandidateState.concat([states[j].memory for j in jobs])
        bumped = oom_bumped_value(
            config.memory, [o.limit_bytes for o in this_round], [o.usage_bytes for o in this_round]
        )
        new_stacked, batch = apply_oom(
            config.memory, stacked, bumped, np.asarray([o.time_ms for o in this_round], dtype=np.int64)
        )
        for row, job_id in enumerate(jobs):
            if np.isnan(bumped[row]):
                continue
            state = states[job_id]
            rows = {**state.rows, Resource.MEMORY: CandidateRow.of(batch, row)}
            states[job_id] = replace(state, memory=new_stacked.take([row]), rows=rows)
            changed.add(job_id)
    return changed


__all__ = [
    "ApplyResult",
    "CandidateRow",
    "HistogramInput",
    "HorizontalSettings",
    "OomInput",
    "RecommenderConfig",
    "RecommenderState",
    "apply_histograms",
    "apply_horizontal_settings",
    "apply_ooms",
    "initial_recommender_state",
]
