"""One window histogram: the CPU and memory rules, sums, sparse/dense and bytes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.usage.buckets import CPU_SCHEME, MEMORY_SCHEME, BucketScheme, Resource
from cellpilot.usage.histogram import Histogram, SparseHistogram, stack_counts, sum_histograms

TINY = BucketScheme("tiny", 3, Resource.CPU, "cores", np.array([1.0, 2.0, 4.0, 8.0]))


def hist(counts: list[float], start_ms: int = 0, scheme: BucketScheme = TINY) -> Histogram:
    return Histogram(scheme, start_ms, 300_000, np.asarray(counts, dtype=float))


def test_cpu_rule_counts_every_sample() -> None:
    h = Histogram.from_values(TINY, 0, [0.5, 1.5, 1.7, 3.0, 3.9, 3.99, 100.0])
    assert h.counts.tolist() == [1.0, 2.0, 3.0, 1.0]
    assert h.total == 7.0


def test_memory_rule_records_only_the_peak() -> None:
    h = Histogram.from_peak(TINY, 0, [0.5, 1.5, 3.0, 2.0])
    assert h.counts.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert Histogram.from_peak(TINY, 0, []).is_empty


@pytest.mark.parametrize(
    ("counts", "mean", "peak"),
    [([2, 0, 1, 1], (2 * 1 + 4 + 8) / 4, 8.0), ([0, 3, 0, 0], 2.0, 2.0), ([0, 0, 0, 0], None, None)],
    ids=["spread", "single", "empty"],
)
def test_mean_and_peak_use_the_bucket_values(
    counts: list[float], mean: float | None, peak: float | None
) -> None:
    h = hist(counts)
    if mean is None:
        assert np.isnan(h.mean())
        assert np.isnan(h.peak())
    else:
        assert h.mean() == pytest.approx(mean)
        assert h.peak() == peak


def test_job_histogram_is_the_sum_of_task_histograms() -> None:
    total = sum_histograms([hist([1, 0, 2, 0]), hist([0, 1, 2, 3])])
    assert total.counts.tolist() == [1.0, 1.0, 4.0, 3.0]
    with pytest.raises(ValueError):
        sum_histograms([hist([1, 0, 0, 0]), hist([1, 0, 0, 0], start_ms=300_000)])


def test_stack_counts_builds_the_batch_matrix() -> None:
    matrix = stack_counts([hist([1, 0, 0, 0]), hist([0, 0, 0, 5])])
    assert matrix.shape == (2, 4)
    assert matrix[1, 3] == 5.0


@pytest.mark.parametrize(
    ("counts", "window_ms"),
    [([1, 2, 3], 300_000), ([1, -1, 0, 0], 300_000), ([1, np.nan, 0, 0], 300_000), ([0, 0, 0, 0], 0)],
    ids=["wrong-length", "negative", "nan", "zero-window"],
)
def test_invalid_histograms_are_rejected(counts: list[float], window_ms: int) -> None:
    with pytest.raises(ValueError):
        Histogram(TINY, 0, window_ms, np.asarray(counts, dtype=float))


def test_sparse_keeps_only_non_zero_buckets() -> None:
    sparse = hist([0, 3, 0, 1.5]).to_sparse()
    assert sparse.indices.tolist() == [1, 3]
    assert sparse.counts.tolist() == [3.0, 1.5]
    assert sparse.to_dense() == hist([0, 3, 0, 1.5])


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(st.integers(0, 399), st.floats(0.5, 1e6, allow_nan=False), max_size=40),
    st.integers(-(2**40), 2**40),
    st.sampled_from([CPU_SCHEME, MEMORY_SCHEME]),
)
def test_bytes_round_trip(nonzero: dict[int, float], start_ms: int, scheme: BucketScheme) -> None:
    counts = np.zeros(scheme.size)
    for index, value in nonzero.items():
        counts[index] = value
    original = Histogram(scheme, start_ms, 60_000, counts)
    data = original.to_bytes()
    assert len(data) < 64 + 12 * len(nonzero) + len(scheme.scheme_id)
    assert Histogram.from_bytes(data) == original


def test_custom_schemes_need_to_be_named_when_decoding() -> None:
    data = hist([1, 0, 0, 2]).to_bytes()
    with pytest.raises(KeyError):
        Histogram.from_bytes(data)
    assert Histogram.from_bytes(data, schemes=[TINY]) == hist([1, 0, 0, 2])


@pytest.mark.parametrize(
    "mangle",
    [lambda b: b"XXXX" + b[4:], lambda b: b[:-1], lambda b: b[:5]],
    ids=["bad-magic", "truncated-payload", "truncated-header"],
)
def test_corrupt_bytes_are_rejected(mangle: Callable[[bytes], bytes]) -> None:
    data = hist([1, 0, 0, 2]).to_bytes()
    with pytest.raises(ValueError):
        SparseHistogram.from_bytes(mangle(data), schemes=[TINY])
