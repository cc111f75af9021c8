"""Event-time windows of one partition, checked against a brute-force count of the samples."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.autopilot import array_bundle
from cellpilot.autopilot.event_windows import (
    BatchSequences,
    PartitionWindows,
    SampleChunk,
    TaskWindows,
    WindowingConfig,
)
from cellpilot.usage.buckets import CPU_SCHEME

W = 60_000  # a one-minute window keeps the tables small


def chunk(rows: list[tuple[int, int, float, float]], state: PartitionWindows | None = None) -> SampleChunk:
    """(task, time_ms, cpu millicores, memory bytes) rows; samples at a time divisible by 3 ms are throttled,
    with a quarter of their CPU more left unmet.

    With ``state``, task i is interned as ("job-<i % 2>", i) in its registry.
    """
    arr = np.array(rows, dtype=np.float64).reshape(-1, 4)
    tasks = arr[:, 0].astype(np.int64)
    if state is not None:
        tasks = np.array([state.tasks.key(f"job-{t % 2}", int(t)) for t in tasks.tolist()], dtype=np.int64)
    return SampleChunk(
        tasks,
        arr[:, 1].astype(np.int64),
        arr[:, 2],
        arr[:, 3],
        (arr[:, 1].astype(np.int64) % 3 == 0),
        np.where(arr[:, 1].astype(np.int64) % 3 == 0, arr[:, 2] / 4, 0.0),
    )


def brute_force(rows: list[tuple[int, int, float, float]]) -> dict[tuple[int, int], dict[str, object]]:
    """Per (task, window start): CPU bucket counts, sample count, sums and maxima."""
    out: dict[tuple[int, int], dict[str, object]] = {}
    for task, t, cpu, mem in rows:
        key = (task, (t // W) * W)
        entry = out.setdefault(
            key,
            {
                "buckets": defaultdict(float),
                "n": 0,
                "cpu_sum": 0.0,
                "cpu_max": -1.0,
                "mem_max": -1.0,
                "thr": 0,
                "unmet": 0.0,
            },
        )
        bucket = int(np.searchsorted(CPU_SCHEME.boundaries, cpu, side="right"))
        entry["buckets"][min(bucket, CPU_SCHEME.size - 1)] += 1.0  # type: ignore[index]
        entry["n"] += 1  # type: ignore[operator]
        entry["cpu_sum"] += cpu  # type: ignore[operator]
        entry["cpu_max"] = max(entry["cpu_max"], cpu)  # type: ignore[call-overload]
        entry["mem_max"] = max(entry["mem_max"], mem)  # type: ignore[call-overload]
        entry["thr"] += int(t % 3 == 0)  # type: ignore[operator]
        entry["unmet"] += cpu / 4 if t % 3 == 0 else 0.0  # type: ignore[operator]
    return out


def as_table(windows: TaskWindows) -> dict[tuple[int, int], dict[str, object]]:
    out = {}
    for row in range(len(windows)):
        lo, hi = windows.cpu.indptr[row], windows.cpu.indptr[row + 1]
        s = windows.stats
        out[(int(s.keys[row]), int(s.start_ms[row]))] = {
            "buckets": dict(
                zip(windows.cpu.buckets[lo:hi].tolist(), windows.cpu.counts[lo:hi].tolist(), strict=True)
            ),
            "n": int(s.samples[row]),
            "cpu_sum": float(s.cpu_sum[row]),
            "cpu_max": float(s.cpu_max[row]),
            "mem_max": float(s.memory_max[row]),
            "thr": int(s.throttled[row]),
            "unmet": float(s.cpu_unmet_sum[row]),
        }
    return out


def assert_same(
    got: dict[tuple[int, int], dict[str, object]], want: dict[tuple[int, int], dict[str, object]]
) -> None:
    assert set(got) == set(want)
    for key, entry in want.items():
        g = got[key]
        assert g["buckets"] == dict(entry["buckets"]), key  # type: ignore[call-overload]
        assert g["n"] == entry["n"]
        assert g["cpu_sum"] == pytest.approx(entry["cpu_sum"])
        assert g["cpu_max"] == entry["cpu_max"]
        assert g["mem_max"] == entry["mem_max"]
        assert g["thr"] == entry["thr"]
        assert g["unmet"] == pytest.approx(entry["unmet"])


@pytest.mark.parametrize(
    ("watermark", "grace", "expected"),
    [(125_000, 0, 120_000), (125_000, 10_000, 60_000), (60_000, 0, 60_000), (59_999, 0, 0)],
    ids=["past-two-windows", "grace-holds-one-back", "exactly-on-boundary", "just-before-boundary"],
)
def test_closable_end_is_on_the_window_grid(watermark: int, grace: int, expected: int) -> None:
    assert WindowingConfig(W, 0, grace).closable_end(watermark) == expected


@settings(max_examples=40, deadline=None)
@given(
    samples=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.integers(0, 5 * W - 1),
            st.floats(0.0, 50.0, allow_nan=False),
            st.floats(1e6, 1e10, allow_nan=False),
        ),
        min_size=1,
        max_size=120,
    ),
    splits=st.lists(st.integers(0, 120), max_size=6),
    fold_every=st.sampled_from([1, 7, 10_000]),
)
def test_windows_equal_a_brute_force_count_whatever_the_chunking(
    samples: list[tuple[int, int, float, float]], splits: list[int], fold_every: int
) -> None:
    # Arrival order is event order within the stream, so nothing is late; cut into chunks.
    rows = sorted(samples, key=lambda r: r[1])
    cuts = sorted({min(c, len(rows)) for c in splits})
    state = PartitionWindows(WindowingConfig(W, 0, 0), fold_every_samples=fold_every)
    start = 0
    for cut in [*cuts, len(rows)]:
        part = rows[start:cut]
        start = cut
        if part:
            state.add(chunk(part, state))
    # Close everything by pushing the watermark far ahead (no samples are added).
    state.max_event_ms = 10 * W
    closed = state.close_ready()
    assert state.late_samples == 0
    assert len(state.open) == 0
    want = brute_force(rows)
    table = as_table(closed.windows)
    by_identity = {}
    for row, (key, start) in enumerate(table):
        index = int(closed.task_index[row])
        assert closed.job_ids[row] == f"job-{index % 2}"
        by_identity[(index, start)] = table[(key, start)]
    assert_same(by_identity, want)
    assert closed.closed_through_ms == 10 * W


def test_late_samples_within_grace_are_merged_and_later_ones_counted_and_dropped() -> None:
    state = PartitionWindows(WindowingConfig(W, out_of_orderness_ms=0, grace_ms=20_000))
    state.add(chunk([(0, 10_000, 1.0, 1e6), (0, 70_000, 1.0, 1e6)], state))
    # Watermark 70 s: window [0, 60 s) may close only once the watermark reaches 80 s.
    assert len(state.close_ready()) == 0
    state.add(chunk([(0, 50_000, 2.0, 2e6)], state))  # late but within grace: merged
    state.add(chunk([(0, 85_000, 1.0, 1e6)], state))  # watermark 85 s
    closed = state.close_ready()
    assert closed.closed_through_ms == 60_000
    assert int(closed.windows.stats.samples.sum()) == 2
    assert float(closed.windows.stats.memory_max[0]) == 2e6
    state.add(chunk([(0, 59_000, 3.0, 3e6), (0, 90_000, 1.0, 1e6)], state))  # first one is too late
    assert state.late_samples == 1
    assert state.accepted_samples == 5


def test_a_restored_checkpoint_continues_exactly_like_the_uninterrupted_run() -> None:
    rng = np.random.default_rng(7)
    times = np.sort(rng.integers(0, 6 * W, 400))
    rows = [
        (int(rng.integers(0, 6)), int(t), float(rng.uniform(0, 8)), float(rng.uniform(1e7, 1e9)))
        for t in times
    ]
    config = WindowingConfig(W, out_of_orderness_ms=5_000, grace_ms=5_000)

    def run(restart_at: int | None) -> tuple[dict[tuple[int, int], dict[str, object]], int]:
        state = PartitionWindows(config, fold_every_samples=50)
        closed_parts = []
        for i in range(0, len(rows), 25):
            if restart_at is not None and i == restart_at:
                state = PartitionWindows.from_bytes(state.to_bytes(), config, fold_every_samples=50)
            state.add(chunk(rows[i : i + 25], state))
            closed_parts.append(state.close_ready())
        state.max_event_ms = 100 * W
        closed_parts.append(state.close_ready())
        table = {}
        for closed in closed_parts:
            part = as_table(closed.windows)
            for row, (_, start) in enumerate(part):
                table[(int(closed.task_index[row]), start)] = list(part.values())[row]
        return table, state.accepted_samples

    uninterrupted = run(None)
    assert uninterrupted[1] == len(rows)
    assert_same(uninterrupted[0], brute_force(rows))
    for restart in (25, 200, 375):
        restarted = run(restart)
        assert restarted[1] == uninterrupted[1]
        assert_same(restarted[0], brute_force(rows))


@pytest.mark.parametrize(
    ("arrivals", "accepted"),
    [
        ([5, 6, 7], [True, True, True]),
        ([5, 6, 6, 5], [True, True, False, False]),
        ([5, 7, 6, 7], [True, True, True, False]),
        ([5, 9, 8, 6, 7, 9], [True, True, True, True, True, False]),
    ],
    ids=["in-order", "replayed", "out-of-order-retry", "gap-filled-later"],
)
def test_batch_sequences_drop_only_repeats(arrivals: list[int], accepted: list[bool]) -> None:
    sequences = BatchSequences()
    assert [sequences.first_time("m1", s) for s in arrivals] == accepted
    restored = BatchSequences.from_meta(sequences.to_meta())
    assert all(not restored.first_time("m1", s) for s in arrivals)


def test_a_gap_wider_than_the_pending_bound_is_given_up() -> None:
    sequences = BatchSequences(max_pending=3)
    assert sequences.first_time("m", 0)
    for s in (2, 3, 4, 5):  # 1 never arrives
        assert sequences.first_time("m", s)
    assert not sequences.first_time("m", 1)  # given up on: treated as seen
    assert sequences.first_time("m", 6)


def test_the_registry_forgets_closed_tasks_but_never_reuses_keys() -> None:
    state = PartitionWindows(WindowingConfig(W, 0, 0))
    old = state.tasks.key("a", 0)
    state.add(chunk([(old, 1_000, 1.0, 1e6)]))
    state.max_event_ms = 2 * W
    state.close_ready()
    assert len(state.tasks) == 0
    assert state.tasks.key("a", 0) != old


def test_a_checkpoint_from_before_unmet_demand_was_kept_reads_it_as_zero() -> None:
    config = WindowingConfig(W, out_of_orderness_ms=0, grace_ms=0)
    state = PartitionWindows(config)
    state.add(chunk([(0, 10, 1.0, 1e6), (1, 12, 2.0, 1e6)], state))
    arrays, meta = array_bundle.unpack(state.to_bytes())
    del arrays["stats_cpu_unmet_sum"]
    restored = PartitionWindows.from_bytes(array_bundle.pack(arrays, meta), config)
    assert restored.open.stats.cpu_unmet_sum.tolist() == [0.0, 0.0]
    assert restored.open.stats.samples.tolist() == [1, 1]


def test_a_checkpoint_under_the_legacy_cores_scheme_reads_in_millicores() -> None:
    config = WindowingConfig(W, out_of_orderness_ms=0, grace_ms=0)
    state = PartitionWindows(config)
    state.add(chunk([(0, 10, 1500.0, 1e6), (0, 30, 250.0, 1e6), (1, 12, 2000.0, 1e6)], state))
    arrays, meta = array_bundle.unpack(state.to_bytes())
    # What a release that kept CPU in cores wrote: the same buckets, sums and maxima in cores.
    meta["scheme"] = ["cpu-cores-geometric", 1]
    for name in ("stats_cpu_sum", "stats_cpu_max", "stats_cpu_unmet_sum"):
        arrays[name] = arrays[name] / 1000.0
    restored = PartitionWindows.from_bytes(array_bundle.pack(arrays, meta), config)
    assert restored.open.cpu.scheme is CPU_SCHEME
    np.testing.assert_array_equal(restored.open.cpu.counts, state.open.cpu.counts)
    np.testing.assert_array_equal(restored.open.cpu.buckets, state.open.cpu.buckets)
    for name in ("cpu_sum", "cpu_max", "cpu_unmet_sum"):
        np.testing.assert_allclose(
            getattr(restored.open.stats, name), getattr(state.open.stats, name), rtol=1e-12
        )
