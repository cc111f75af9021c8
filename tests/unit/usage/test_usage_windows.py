"""Batch window builders against a plain per-sample loop, per-job sums, partial merges."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.usage.buckets import CPU_SCHEME, MEMORY_SCHEME, BucketScheme, Resource
from cellpilot.usage.windows import (
    SignalKind,
    WindowBatch,
    build_job_windows,
    build_task_windows,
    concat_windows,
    merge_partial_windows,
    sum_by_group,
    window_starts,
)

TINY = BucketScheme("tiny-w", 1, Resource.CPU, "cores", np.array([1.0, 2.0, 4.0, 8.0]))
TINY_MEM = BucketScheme("tiny-m", 1, Resource.MEMORY, "bytes", np.array([1.0, 2.0, 4.0, 8.0]))

Key = tuple[int, int]


def bucket_by_scan(boundaries: np.ndarray, value: float) -> int:
    for k, upper in enumerate(boundaries):
        if value < upper:
            return k
    return len(boundaries) - 1


def plain_windows(
    scheme: BucketScheme, tasks: list[int], times: list[int], values: list[float], window_ms: int, peak: bool
) -> dict[Key, dict[int, float]]:
    """The §3.2.1 definitions, one sample at a time."""
    grouped: dict[Key, list[float]] = defaultdict(list)
    for task, t, v in zip(tasks, times, values, strict=True):
        grouped[(task, (t // window_ms) * window_ms)].append(v)
    out: dict[Key, dict[int, float]] = {}
    for key, vals in grouped.items():
        counts: dict[int, float] = defaultdict(float)
        for v in [max(vals)] if peak else vals:
            counts[bucket_by_scan(scheme.boundaries, v)] += 1.0
        out[key] = dict(counts)
    return out


def as_dict(batch: WindowBatch) -> dict[Key, dict[int, float]]:
    out: dict[Key, dict[int, float]] = {}
    for i in range(len(batch)):
        lo, hi = batch.indptr[i], batch.indptr[i + 1]
        out[(int(batch.keys[i]), int(batch.start_ms[i]))] = {
            int(b): float(c) for b, c in zip(batch.buckets[lo:hi], batch.counts[lo:hi], strict=True)
        }
    return out


samples = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 20_000), st.floats(0.0, 10.0, allow_nan=False)),
    min_size=1,
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(samples, st.sampled_from([1_000, 3_000, 7_000]), st.booleans())
def test_task_windows_match_the_per_sample_definition(
    rows: list[tuple[int, int, float]], window_ms: int, peak: bool
) -> None:
    tasks, times, values = (list(col) for col in zip(*rows, strict=True))
    kind = SignalKind.PEAK if peak else SignalKind.DISTRIBUTION
    batch = build_task_windows(TINY, tasks, times, values, kind=kind, window_ms=window_ms)
    assert as_dict(batch) == plain_windows(TINY, tasks, times, values, window_ms, peak)
    keys = list(zip(batch.keys.tolist(), batch.start_ms.tolist(), strict=True))
    assert keys == sorted(keys)


def test_memory_windows_have_one_count_per_task_window() -> None:
    rng = np.random.default_rng(4)
    tasks = rng.integers(0, 30, 5000)
    times = rng.integers(0, 3_600_000, 5000)
    values = rng.uniform(1e6, 1e11, 5000)
    batch = build_task_windows(MEMORY_SCHEME, tasks, times, values)
    assert np.all(np.diff(batch.indptr) == 1)
    assert np.all(batch.counts == 1.0)
    # The recorded bucket is the bucket of the window's peak.
    first = (tasks == batch.keys[0]) & (window_starts(times, 300_000) == batch.start_ms[0])
    assert batch.buckets[0] == MEMORY_SCHEME.index_of(values[first].max())


def test_default_kind_follows_the_resource() -> None:
    values = [1.5, 3.0, 3.5]
    cpu = build_task_windows(TINY, [0, 0, 0], [0, 1, 2], values)
    mem = build_task_windows(TINY_MEM, [0, 0, 0], [0, 1, 2], values)
    assert cpu.dense().tolist() == [[0.0, 1.0, 2.0, 0.0]]
    assert mem.dense().tolist() == [[0.0, 0.0, 1.0, 0.0]]


def test_job_windows_sum_their_tasks_and_windows_respect_the_origin() -> None:
    # Tasks 10, 11 belong to job 1; task 20 to job 2. Windows of 10 s starting at t = 5 s.
    jobs = [1, 1, 1, 2, 1]
    tasks = [10, 11, 11, 20, 10]
    times = [5_000, 6_000, 14_999, 7_000, 15_000]
    values = [0.5, 1.5, 3.0, 5.0, 0.5]
    task_batch, job_batch = build_job_windows(
        TINY, jobs, tasks, times, values, window_ms=10_000, origin_ms=5_000
    )
    assert as_dict(job_batch) == {
        (1, 5_000): {0: 1.0, 1: 1.0, 2: 1.0},
        (1, 15_000): {0: 1.0},
        (2, 5_000): {3: 1.0},
    }
    assert len(task_batch) == 4
    assert np.array_equal(job_batch.end_ms, job_batch.start_ms + 10_000)


def test_a_task_in_two_jobs_is_an_error() -> None:
    with pytest.raises(ValueError):
        build_job_windows(TINY, [1, 2], [7, 7], [0, 1], [1.0, 1.0])


def test_sum_by_group_adds_same_window_rows() -> None:
    batch = build_task_windows(TINY, [0, 1, 2], [0, 0, 0], [0.5, 0.5, 3.0], window_ms=1000)
    summed = sum_by_group(batch, [9, 9, 8])
    assert as_dict(summed) == {(8, 0): {2: 1.0}, (9, 0): {0: 2.0}}


@settings(max_examples=40, deadline=None)
@given(samples, st.integers(0, 80), st.booleans())
def test_merging_chunks_equals_building_from_all_samples(
    rows: list[tuple[int, int, float]], cut: int, peak: bool
) -> None:
    tasks, times, values = (np.asarray(col) for col in zip(*rows, strict=True))
    kind = SignalKind.PEAK if peak else SignalKind.DISTRIBUTION
    parts = [
        build_task_windows(TINY, tasks[s], times[s], values[s], kind=kind, window_ms=3_000)
        for s in (slice(0, cut), slice(cut, None))
    ]
    merged = merge_partial_windows(concat_windows(parts), kind)
    whole = build_task_windows(TINY, tasks, times, values, kind=kind, window_ms=3_000)
    assert as_dict(merged) == as_dict(whole)


def test_split_closed_and_dense_rows() -> None:
    batch = build_task_windows(CPU_SCHEME, [0, 0, 1], [0, 300_000, 299_999], [0.1, 0.2, 0.3])
    closed, still_open = batch.split_closed(watermark_ms=300_000)
    assert len(closed) == 2
    assert len(still_open) == 1
    assert int(still_open.start_ms[0]) == 300_000
    dense = batch.dense()
    assert dense.shape == (3, CPU_SCHEME.size)
    assert dense.sum() == 3.0
    # Rows are sorted by (task, window): (0, 0), (0, 300 000), (1, 0).
    assert [batch.histogram(i).start_ms for i in range(3)] == [0, 300_000, 0]
    assert np.array_equal(batch.histogram(2).counts, dense[2])


def test_empty_input_gives_an_empty_batch() -> None:
    batch = build_task_windows(CPU_SCHEME, [], [], [])
    assert len(batch) == 0
    assert batch.dense().shape == (0, CPU_SCHEME.size)
