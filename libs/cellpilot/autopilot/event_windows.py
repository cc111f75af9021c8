"""Event-time windows of raw usage samples for one input partition (Autopilot §3.2.1).

The monitoring system turns each task's raw signal r_i[τ] (about one sample a second) into
5-minute histograms s_i[t] (§3.2.1). Here that happens in *event time*, the time stamped on
each sample, so a simulated fleet can run faster than the wall clock and a replay gives the
same windows:

* the **watermark** of a partition is the latest event time seen on it minus a bounded
  out-of-orderness (the samples of one machine arrive in order; machines sharing a
  partition may be a little apart);
* a window [s, s + W) **closes** once the watermark has passed its end by the **grace
  period**; samples that arrive for it before then are merged into it;
* a sample for a window that has already closed is **late**: counted and dropped.

Open windows are kept per task as a CPU :class:`~cellpilot.usage.windows.WindowBatch`
(distribution rule, every sample counts) plus :class:`WindowStats` (sample counts, sums and
maxima), from which the memory histogram (peak rule: one count at the bucket of the task's
peak) and the per-window summaries follow. Samples are buffered and folded in chunks, and
the whole state serialises (:meth:`PartitionWindows.to_bytes`) so that a crashed
aggregator's successor resumes exactly where the checkpoint left off.

CPU values are in millicores (the CPU scheme's unit), memory in bytes. Pure numpy, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, Int64Array
from cellpilot.autopilot import array_bundle
from cellpilot.usage.buckets import CPU_SCHEME, BucketScheme, legacy_value_scale, lookup_scheme
from cellpilot.usage.histogram import DEFAULT_WINDOW_MS
from cellpilot.usage.row_arrays import RowArrays
from cellpilot.usage.windows import (
    SignalKind,
    WindowBatch,
    build_task_windows,
    concat_windows,
    group_runs,
    merge_partial_windows,
    window_starts,
)

_FORMAT = 1


@dataclass(frozen=True)
class WindowingConfig:
    """Window length W (§3.2.1: typically 5 minutes), watermark lag and grace period (ours)."""

    window_ms: int = DEFAULT_WINDOW_MS
    out_of_orderness_ms: int = 10_000
    grace_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.window_ms <= 0:
            raise ValueError("window_ms must be positive")
        if self.out_of_orderness_ms < 0 or self.grace_ms < 0:
            raise ValueError("out_of_orderness_ms and grace_ms must be >= 0")

    def closable_end(self, watermark_ms: int) -> int:
        """The end of the last window that may close at this watermark (on the window grid)."""
        return ((watermark_ms - self.grace_ms) // self.window_ms) * self.window_ms


@dataclass(frozen=True, eq=False)
class SampleChunk(RowArrays):
    """Raw samples r_i[τ] as parallel arrays; ``task`` is a key from a :class:`TaskRegistry`."""

    task: Int64Array
    time_ms: Int64Array
    cpu: FloatArray  # millicores
    memory: FloatArray  # bytes
    throttled: BoolArray
    unmet: FloatArray = None  # type: ignore[assignment]  # unmet CPU demand (millicores); None = zeros

    def __post_init__(self) -> None:
        n = self.task.shape
        if self.unmet is None:
            object.__setattr__(self, "unmet", np.zeros(n))
        if not (
            self.time_ms.shape
            == self.cpu.shape
            == self.memory.shape
            == self.throttled.shape
            == self.unmet.shape
            == n
        ):
            raise ValueError("sample arrays must have the same length")

    @classmethod
    def empty(cls) -> SampleChunk:
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none.copy(), np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool))


_STAT_ADD = ("samples", "cpu_sum", "memory_sum", "throttled", "cpu_unmet_sum")
_STAT_MAX = ("cpu_max", "memory_max")
_STAT_FIELDS = ("keys", "start_ms", *_STAT_ADD, *_STAT_MAX)


@dataclass(frozen=True, eq=False)
class WindowStats(RowArrays):
    """One row per (task, window) with samples, sorted by (key, start_ms)."""

    keys: Int64Array
    start_ms: Int64Array
    samples: Int64Array
    cpu_sum: FloatArray
    cpu_max: FloatArray
    memory_sum: FloatArray
    memory_max: FloatArray
    throttled: Int64Array
    # Sum of the samples' unmet CPU demand (millicores); a 1-second sample's value is also its
    # throttled CPU-seconds. None = zeros (windows from before it was measured).
    cpu_unmet_sum: FloatArray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.cpu_unmet_sum is None:
            object.__setattr__(self, "cpu_unmet_sum", np.zeros(self.keys.shape))

    @classmethod
    def empty(cls) -> WindowStats:
        i, f = np.zeros(0, dtype=np.int64), np.zeros(0)
        return cls(i, i.copy(), i.copy(), f, f.copy(), f.copy(), f.copy(), i.copy(), f.copy())

    @classmethod
    def reduce_rows(
        cls, keys: Int64Array, starts: Int64Array, columns: dict[str, npt.NDArray[Any]]
    ) -> WindowStats:
        order, heads = group_runs(keys, starts)
        if heads.size == 0:
            return cls.empty()
        out: dict[str, npt.NDArray[Any]] = {}
        for name in _STAT_ADD:
            out[name] = np.add.reduceat(columns[name][order], heads)
        for name in _STAT_MAX:
            out[name] = np.maximum.reduceat(columns[name][order], heads)
        return cls(
            keys=keys[order][heads],
            start_ms=starts[order][heads],
            samples=out["samples"].astype(np.int64),
            cpu_sum=out["cpu_sum"].astype(np.float64),
            cpu_max=out["cpu_max"].astype(np.float64),
            memory_sum=out["memory_sum"].astype(np.float64),
            memory_max=out["memory_max"].astype(np.float64),
            throttled=out["throttled"].astype(np.int64),
            cpu_unmet_sum=out["cpu_unmet_sum"].astype(np.float64),
        )

    @classmethod
    def from_samples(cls, chunk: SampleChunk, window_ms: int) -> WindowStats:
        starts = window_starts(chunk.time_ms, window_ms)
        return cls.reduce_rows(
            chunk.task,
            starts,
            {
                "samples": np.ones(len(chunk), dtype=np.int64),
                "cpu_sum": chunk.cpu,
                "cpu_max": chunk.cpu,
                "memory_sum": chunk.memory,
                "memory_max": chunk.memory,
                "throttled": chunk.throttled.astype(np.int64),
                "cpu_unmet_sum": chunk.unmet,
            },
        )

    @classmethod
    def merge(cls, parts: Sequence[WindowStats]) -> WindowStats:
        """Rows of the same (task, window) combine: counts and sums add, maxima take the max."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        columns = {
            name: np.concatenate([getattr(p, name) for p in parts]) for name in (*_STAT_ADD, *_STAT_MAX)
        }
        return cls.reduce_rows(
            np.concatenate([p.keys for p in parts]), np.concatenate([p.start_ms for p in parts]), columns
        )

    def arrays(self, prefix: str) -> dict[str, npt.NDArray[Any]]:
        return {f"{prefix}{name}": getattr(self, name) for name in _STAT_FIELDS}

    @classmethod
    def from_arrays(cls, arrays: dict[str, npt.NDArray[Any]], prefix: str) -> WindowStats:
        """Inverse of :meth:`arrays`; a checkpoint from before unmet demand was kept reads as zeros."""
        return cls(**{name: arrays.get(f"{prefix}{name}") for name in _STAT_FIELDS})  # type: ignore[arg-type]


def _empty_batch(scheme: BucketScheme, window_ms: int) -> WindowBatch:
    none = np.zeros(0, dtype=np.int64)
    return build_task_windows(
        scheme, none, none, np.zeros(0), kind=SignalKind.DISTRIBUTION, window_ms=window_ms
    )


@dataclass(frozen=True, eq=False)
class TaskWindows:
    """Per-task window histograms: CPU counts (``cpu``) and ``stats``, rows aligned 1:1."""

    cpu: WindowBatch
    stats: WindowStats

    def __post_init__(self) -> None:
        if len(self.cpu) != len(self.stats) or not (
            np.array_equal(self.cpu.keys, self.stats.keys)
            and np.array_equal(self.cpu.start_ms, self.stats.start_ms)
        ):
            raise ValueError("CPU histograms and window stats must describe the same (task, window) rows")

    def __len__(self) -> int:
        return len(self.stats)

    @property
    def window_ms(self) -> int:
        return self.cpu.window_ms

    @classmethod
    def empty(cls, window_ms: int = DEFAULT_WINDOW_MS, scheme: BucketScheme = CPU_SCHEME) -> TaskWindows:
        return cls(_empty_batch(scheme, window_ms), WindowStats.empty())

    @classmethod
    def from_samples(
        cls, chunk: SampleChunk, window_ms: int = DEFAULT_WINDOW_MS, scheme: BucketScheme = CPU_SCHEME
    ) -> TaskWindows:
        cpu = build_task_windows(
            scheme, chunk.task, chunk.time_ms, chunk.cpu, kind=SignalKind.DISTRIBUTION, window_ms=window_ms
        )
        return cls(cpu, WindowStats.from_samples(chunk, window_ms))

    @classmethod
    def merge(cls, parts: Sequence[TaskWindows]) -> TaskWindows:
        nonempty = [p for p in parts if len(p)]
        if len(nonempty) <= 1:
            return nonempty[0] if nonempty else parts[0]
        cpu = merge_partial_windows(concat_windows([p.cpu for p in nonempty]), SignalKind.DISTRIBUTION)
        return cls(cpu, WindowStats.merge([p.stats for p in nonempty]))

    @classmethod
    def concat(cls, parts: Sequence[TaskWindows]) -> TaskWindows:
        """Rows of every part, in order, without merging rows of the same (task, window)."""
        if not parts:
            return cls.empty()
        return cls(concat_windows([p.cpu for p in parts]), WindowStats.concat([p.stats for p in parts]))

    def select(self, mask: BoolArray) -> TaskWindows:
        return TaskWindows(self.cpu.select(mask), self.stats.select(mask))

    def memory_buckets(self, scheme: BucketScheme) -> npt.NDArray[np.intp]:
        """§3.2.1 memory rule: each task-window's histogram is one count at its peak's bucket."""
        return scheme.index_of(self.stats.memory_max)


class TaskRegistry:
    """Small integer keys for (job id, task index) pairs, so windows are array maths."""

    def __init__(self) -> None:
        self._key: dict[tuple[str, int], int] = {}
        self._identity: dict[int, tuple[str, int]] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._key)

    def key(self, job_id: str, task_index: int) -> int:
        identity = (job_id, task_index)
        key = self._key.get(identity)
        if key is None:
            key = self._next
            self._next += 1
            self._key[identity] = key
            self._identity[key] = identity
        return key

    def identity(self, key: int) -> tuple[str, int]:
        return self._identity[key]

    def identities(self, keys: Iterable[int]) -> tuple[tuple[str, ...], Int64Array]:
        pairs = [self._identity[int(k)] for k in keys]
        return tuple(p[0] for p in pairs), np.asarray([p[1] for p in pairs], dtype=np.int64)

    def retain(self, keys: Iterable[int]) -> None:
        """Forget every task not in ``keys`` (keys are never reused)."""
        keep = {int(k) for k in keys}
        for key in [k for k in self._identity if k not in keep]:
            del self._key[self._identity.pop(key)]

    def to_meta(self) -> dict[str, Any]:
        return {"next": self._next, "tasks": [[k, j, i] for k, (j, i) in self._identity.items()]}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> TaskRegistry:
        registry = cls()
        registry._next = int(meta["next"])
        for key, job_id, index in meta["tasks"]:
            registry._key[(str(job_id), int(index))] = int(key)
            registry._identity[int(key)] = (str(job_id), int(index))
        return registry


class BatchSequences:
    """Which batch sequence numbers each source (machine) has delivered: drops repeats.

    A Borglet numbers its batches and re-sends unacknowledged ones (at-least-once), so a
    batch can arrive twice. Per source we keep ``low`` (every sequence up to it is seen)
    and the set seen above it; a gap wider than ``max_pending`` sequences is given up on
    (sequences inside it would then count as repeats).
    """

    def __init__(self, max_pending: int = 256) -> None:
        self.max_pending = max_pending
        self._low: dict[str, int] = {}
        self._seen: dict[str, set[int]] = {}

    def first_time(self, source: str, sequence: int) -> bool:
        low = self._low.get(source)
        if low is None:
            self._low[source] = sequence
            self._seen[source] = set()
            return True
        seen = self._seen[source]
        if sequence <= low or sequence in seen:
            return False
        seen.add(sequence)
        if len(seen) > self.max_pending:
            low = min(seen) - 1
        while low + 1 in seen:
            low += 1
            seen.discard(low)
        self._low[source] = low
        return True

    def to_meta(self) -> dict[str, Any]:
        return {source: [low, sorted(self._seen[source])] for source, low in self._low.items()}

    @classmethod
    def from_meta(cls, meta: dict[str, Any], max_pending: int = 256) -> BatchSequences:
        sequences = cls(max_pending)
        for source, (low, seen) in meta.items():
            sequences._low[source] = int(low)
            sequences._seen[source] = {int(s) for s in seen}
        return sequences


@dataclass(frozen=True, eq=False)
class ClosedWindows:
    """Windows that closed in one step, with each row's task identity."""

    windows: TaskWindows
    job_ids: tuple[str, ...]  # per row
    task_index: Int64Array  # per row
    closed_through_ms: int | None  # every window ending at or before this is closed

    def __len__(self) -> int:
        return len(self.windows)


class PartitionWindows:
    """Open windows, watermark and late/duplicate accounting of one input partition."""

    def __init__(self, config: WindowingConfig, fold_every_samples: int = 200_000) -> None:
        self.config = config
        self.fold_every_samples = fold_every_samples
        self.open = TaskWindows.empty(config.window_ms)
        self.max_event_ms: int | None = None
        self.closed_through_ms: int | None = None
        self.accepted_samples = 0
        self.late_samples = 0
        self.duplicate_batches = 0
        self.tasks = TaskRegistry()
        self.sequences = BatchSequences()
        self._pending: list[SampleChunk] = []
        self._pending_samples = 0

    # -- input -------------------------------------------------------------------------

    @property
    def watermark_ms(self) -> int | None:
        if self.max_event_ms is None:
            return None
        return self.max_event_ms - self.config.out_of_orderness_ms

    @property
    def open_samples(self) -> int:
        return int(self.open.stats.samples.sum()) + self._pending_samples

    def accept_batch(self, source: str, sequence: int) -> bool:
        """False (and counted) if this source already delivered this batch sequence."""
        if self.sequences.first_time(source, sequence):
            return True
        self.duplicate_batches += 1
        return False

    def add(self, chunk: SampleChunk) -> int:
        """Fold samples in; those for already-closed windows are counted late and dropped.

        Returns the number of samples accepted.
        """
        if len(chunk) == 0:
            return 0
        if self.closed_through_ms is not None:
            ends = window_starts(chunk.time_ms, self.config.window_ms) + self.config.window_ms
            on_time = ends > self.closed_through_ms
            late = int(len(chunk) - np.count_nonzero(on_time))
            if late:
                self.late_samples += late
                chunk = chunk.select(on_time)
        if len(chunk) == 0:
            return 0
        latest = int(chunk.time_ms.max())
        self.max_event_ms = latest if self.max_event_ms is None else max(self.max_event_ms, latest)
        self._pending.append(chunk)
        self._pending_samples += len(chunk)
        self.accepted_samples += len(chunk)
        if self._pending_samples >= self.fold_every_samples:
            self._fold()
        return len(chunk)

    def _fold(self) -> None:
        if not self._pending:
            return
        fresh = TaskWindows.from_samples(SampleChunk.concat(self._pending), self.config.window_ms)
        self.open = TaskWindows.merge([self.open, fresh])
        self._pending = []
        self._pending_samples = 0

    # -- output ------------------------------------------------------------------------

    def close_ready(self) -> ClosedWindows:
        """Close every window the watermark has passed by the grace period."""
        watermark = self.watermark_ms
        if watermark is None:
            return ClosedWindows(
                TaskWindows.empty(self.config.window_ms),
                (),
                np.zeros(0, dtype=np.int64),
                self.closed_through_ms,
            )
        return self.close_through(self.config.closable_end(watermark))

    def close_through(self, end_ms: int) -> ClosedWindows:
        """Close every window ending at or before ``end_ms`` regardless of the watermark.

        Used when the windows up to ``end_ms`` were already summed without this partition
        (it was idle): samples for them that arrive from now on count as late.
        """
        if self.closed_through_ms is not None and end_ms <= self.closed_through_ms:
            return ClosedWindows(
                TaskWindows.empty(self.config.window_ms),
                (),
                np.zeros(0, dtype=np.int64),
                self.closed_through_ms,
            )
        self._fold()
        closing = (self.open.stats.start_ms + self.config.window_ms) <= end_ms
        closed = self.open.select(closing)
        self.open = self.open.select(~closing)
        self.closed_through_ms = end_ms
        job_ids, task_index = self.tasks.identities(closed.stats.keys)
        self.tasks.retain(self.open.stats.keys)
        return ClosedWindows(closed, job_ids, task_index, end_ms)

    def flush(self) -> ClosedWindows:
        """Close every open window now: the input has gone quiet (end of stream).

        Samples that arrive later for these windows count as late.
        """
        self._fold()
        if len(self.open) == 0:
            return ClosedWindows(
                TaskWindows.empty(self.config.window_ms),
                (),
                np.zeros(0, dtype=np.int64),
                self.closed_through_ms,
            )
        end = int((self.open.stats.start_ms + self.config.window_ms).max())
        closed = self.open
        self.open = TaskWindows.empty(self.config.window_ms)
        self.closed_through_ms = end if self.closed_through_ms is None else max(end, self.closed_through_ms)
        job_ids, task_index = self.tasks.identities(closed.stats.keys)
        self.tasks.retain(())
        return ClosedWindows(closed, job_ids, task_index, self.closed_through_ms)

    # -- checkpoint --------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        self._fold()
        cpu = self.open.cpu
        arrays: dict[str, npt.NDArray[Any]] = {
            "cpu_keys": cpu.keys,
            "cpu_start_ms": cpu.start_ms,
            "cpu_indptr": cpu.indptr,
            "cpu_buckets": cpu.buckets,
            "cpu_counts": cpu.counts,
            **self.open.stats.arrays("stats_"),
        }
        meta = {
            "format": _FORMAT,
            "window_ms": self.config.window_ms,
            "scheme": [cpu.scheme.scheme_id, cpu.scheme.version],
            "max_event_ms": self.max_event_ms,
            "closed_through_ms": self.closed_through_ms,
            "accepted_samples": self.accepted_samples,
            "late_samples": self.late_samples,
            "duplicate_batches": self.duplicate_batches,
            "tasks": self.tasks.to_meta(),
            "sequences": self.sequences.to_meta(),
        }
        return array_bundle.pack(arrays, meta)

    @classmethod
    def from_bytes(
        cls, data: bytes, config: WindowingConfig, fold_every_samples: int = 200_000
    ) -> PartitionWindows:
        arrays, meta = array_bundle.unpack(data)
        if meta.get("format") != _FORMAT:
            raise ValueError(f"unsupported partition checkpoint format {meta.get('format')}")
        if int(meta["window_ms"]) != config.window_ms:
            raise ValueError("the checkpoint was taken with a different window length")
        scheme_id, version = meta["scheme"]
        if lookup_scheme(scheme_id, int(version)) is not CPU_SCHEME:
            raise ValueError("the checkpoint uses a different CPU bucket scheme")
        # A checkpoint under the legacy cores scheme: the same buckets, CPU sums in cores.
        cpu_scale = legacy_value_scale(scheme_id, int(version))
        state = cls(config, fold_every_samples)
        cpu = WindowBatch(
            CPU_SCHEME,
            config.window_ms,
            arrays["cpu_keys"],
            arrays["cpu_start_ms"],
            arrays["cpu_indptr"],
            arrays["cpu_buckets"],
            arrays["cpu_counts"],
        )
        stats = WindowStats.from_arrays(arrays, "stats_")
        if cpu_scale != 1.0:
            stats = replace(
                stats,
                cpu_sum=stats.cpu_sum * cpu_scale,
                cpu_max=stats.cpu_max * cpu_scale,
                cpu_unmet_sum=stats.cpu_unmet_sum * cpu_scale,
            )
        state.open = TaskWindows(cpu, stats)
        state.max_event_ms = None if meta["max_event_ms"] is None else int(meta["max_event_ms"])
        closed = meta["closed_through_ms"]
        state.closed_through_ms = None if closed is None else int(closed)
        state.accepted_samples = int(meta["accepted_samples"])
        state.late_samples = int(meta["late_samples"])
        state.duplicate_batches = int(meta["duplicate_batches"])
        state.tasks = TaskRegistry.from_meta(meta["tasks"])
        state.sequences = BatchSequences.from_meta(meta["sequences"])
        return state
