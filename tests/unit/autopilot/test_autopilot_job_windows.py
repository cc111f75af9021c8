"""Per-job sums of task windows against a brute-force sum over the raw samples."""

from __future__ import annotations

import numpy as np

from cellpilot.autopilot.event_windows import SampleChunk, TaskWindows
from cellpilot.autopilot.job_windows import sum_jobs
from cellpilot.usage.buckets import CPU_SCHEME, MEMORY_SCHEME

W = 60_000


def test_job_sums_match_a_brute_force_over_samples_split_across_partitions() -> None:
    rng = np.random.default_rng(3)
    n = 600
    task = rng.integers(0, 6, n)
    job_of_task = np.array([0, 0, 0, 1, 1, 2])
    time = rng.integers(0, 3 * W, n)
    cpu = rng.uniform(0.01, 4.0, n)
    memory = rng.uniform(1e7, 5e9, n)
    throttled = rng.random(n) < 0.2
    unmet = np.where(throttled, rng.uniform(0.0, 1.0, n), 0.0)
    # Split into two "partitions" at random: a task may have rows in both (it moved machine).
    side = rng.random(n) < 0.5
    parts = [
        TaskWindows.from_samples(
            SampleChunk(task[m], time[m], cpu[m], memory[m], throttled[m], unmet[m]), window_ms=W
        )
        for m in (side, ~side)
    ]
    rows = TaskWindows.concat(parts)  # rows stay separate: sum_jobs must combine them
    jobs = sum_jobs(rows, job_of_task)

    window = (time // W) * W
    for row in range(len(jobs)):
        j, start = int(jobs.keys[row]), int(jobs.start_ms[row])
        in_job = (job_of_task[task] == j) & (window == start)
        want_cpu = np.bincount(CPU_SCHEME.index_of(cpu[in_job]), minlength=CPU_SCHEME.size)
        got_cpu = np.zeros(CPU_SCHEME.size)
        lo, hi = jobs.cpu.indptr[row], jobs.cpu.indptr[row + 1]
        got_cpu[jobs.cpu.buckets[lo:hi]] = jobs.cpu.counts[lo:hi]
        np.testing.assert_array_equal(got_cpu, want_cpu)
        tasks_here = sorted(set(task[in_job].tolist()))
        peaks = [memory[in_job & (task == t)].max() for t in tasks_here]
        want_mem = np.bincount(MEMORY_SCHEME.index_of(np.array(peaks)), minlength=MEMORY_SCHEME.size)
        got_mem = np.zeros(MEMORY_SCHEME.size)
        lo, hi = jobs.memory.indptr[row], jobs.memory.indptr[row + 1]
        got_mem[jobs.memory.buckets[lo:hi]] = jobs.memory.counts[lo:hi]
        np.testing.assert_array_equal(got_mem, want_mem)
        assert int(jobs.task_count[row]) == len(tasks_here)
        assert int(jobs.samples[row]) == int(in_job.sum())
        assert int(jobs.throttled[row]) == int(throttled[in_job].sum())
        assert float(jobs.cpu_peak[row]) == float(cpu[in_job].max())
        assert float(jobs.memory_peak[row]) == float(memory[in_job].max())
        want_mean = sum(cpu[in_job & (task == t)].mean() for t in tasks_here)
        assert np.isclose(jobs.cpu_mean_total[row], want_mean)
        want_unmet = sum(unmet[in_job & (task == t)].mean() for t in tasks_here)
        assert np.isclose(jobs.cpu_unmet_mean_total[row], want_unmet)
    # Every (job, window) with samples is present exactly once.
    want_rows = {(int(job_of_task[t]), int(s)) for t, s in zip(task, window, strict=True)}
    assert {(int(k), int(s)) for k, s in zip(jobs.keys, jobs.start_ms, strict=True)} == want_rows
    assert len(want_rows) == len(jobs)
