"""Bucket schemes: the ranges and precision §3.2.1 asks for, and the bucket rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.usage.buckets import (
    CPU_SCHEME,
    MEMORY_SCHEME,
    TIB,
    BucketScheme,
    Resource,
    geometric_scheme,
    lookup_scheme,
)


def reference_bucket(boundaries: np.ndarray, value: float) -> int:
    """Bucket k holds b[k-1] <= v < b[k] (b[-1] = 0); overflow goes to the last bucket."""
    lower = 0.0
    for k, upper in enumerate(boundaries):
        if lower <= value < upper or (k == 0 and value < upper):
            return k
        lower = upper
    return len(boundaries) - 1


@pytest.mark.parametrize(
    ("scheme", "at_most_lowest", "at_least_highest"),
    [(CPU_SCHEME, 1.0, 256_000.0), (MEMORY_SCHEME, float(2**30), float(TIB))],
    ids=["cpu", "memory"],
)
def test_fixed_schemes_cover_the_range_with_5_percent_precision(
    scheme: BucketScheme, at_most_lowest: float, at_least_highest: float
) -> None:
    assert 380 <= scheme.size <= 420  # "about 400 buckets"
    assert scheme.lowest <= at_most_lowest
    assert scheme.highest >= at_least_highest
    assert np.all(np.diff(scheme.boundaries) > 0)
    widths = np.diff(scheme.boundaries) / scheme.boundaries[:-1]
    assert widths.max() <= 0.05


def test_memory_boundaries_are_whole_bytes() -> None:
    assert np.array_equal(MEMORY_SCHEME.boundaries, np.round(MEMORY_SCHEME.boundaries))


SMALL = BucketScheme("test", 1, Resource.CPU, "cores", np.array([1.0, 2.0, 4.0, 8.0]))


@pytest.mark.parametrize(
    ("value", "bucket"),
    [(-1.0, 0), (0.0, 0), (0.99, 0), (1.0, 1), (1.5, 1), (2.0, 2), (7.99, 3), (8.0, 3), (1e9, 3)],
    ids=["negative", "zero", "below-b0", "at-b0", "inside-1", "at-b1", "below-top", "at-top", "overflow"],
)
def test_index_of_follows_the_papers_bucket_rule(value: float, bucket: int) -> None:
    assert int(SMALL.index_of(value)) == bucket


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=600_000.0, allow_nan=False), min_size=1, max_size=50))
def test_index_of_matches_a_plain_scan_and_bucket_value_exceeds_the_sample(values: list[float]) -> None:
    got = CPU_SCHEME.index_of(values)
    expected = [reference_bucket(CPU_SCHEME.boundaries, v) for v in values]
    assert got.tolist() == expected
    inside = np.asarray(values) < CPU_SCHEME.highest
    assert np.all(CPU_SCHEME.value_of(got)[inside] > np.asarray(values)[inside])


def test_index_of_rejects_nan() -> None:
    with pytest.raises(ValueError):
        CPU_SCHEME.index_of([1.0, float("nan")])


@pytest.mark.parametrize(
    "boundaries",
    [np.array([]), np.array([0.0, 1.0]), np.array([1.0, 1.0]), np.array([2.0, 1.0]), np.array([1.0, np.inf])],
    ids=["empty", "zero", "repeated", "decreasing", "infinite"],
)
def test_invalid_boundaries_are_rejected(boundaries: np.ndarray) -> None:
    with pytest.raises(ValueError):
        BucketScheme("bad", 1, Resource.CPU, "cores", boundaries)


def test_boundaries_are_read_only_and_copied() -> None:
    source = np.array([1.0, 2.0])
    scheme = BucketScheme("copy", 1, Resource.CPU, "cores", source)
    source[0] = 0.5
    assert scheme.boundaries[0] == 1.0
    with pytest.raises(ValueError):
        scheme.boundaries[0] = 3.0


def test_geometric_scheme_has_constant_ratio_and_exact_ends() -> None:
    scheme = geometric_scheme("g", 1, Resource.CPU, "cores", lowest=1.0, highest=1024.0, buckets=11)
    assert scheme.lowest == 1.0
    assert scheme.highest == 1024.0
    assert np.allclose(scheme.boundaries, 2.0 ** np.arange(11))


def test_lookup_scheme_by_id_and_version() -> None:
    assert lookup_scheme(CPU_SCHEME.scheme_id, CPU_SCHEME.version) is CPU_SCHEME
    assert lookup_scheme("test", 1, extra=[SMALL]) is SMALL
    with pytest.raises(KeyError):
        lookup_scheme(CPU_SCHEME.scheme_id, CPU_SCHEME.version + 1)


def test_scheme_equality_compares_boundaries() -> None:
    same = BucketScheme("test", 1, Resource.CPU, "cores", np.array([1.0, 2.0, 4.0, 8.0]))
    other = BucketScheme("test", 1, Resource.CPU, "cores", np.array([1.0, 2.0, 4.0, 9.0]))
    assert same == SMALL
    assert hash(same) == hash(SMALL)
    assert other != SMALL
