"""The legacy CPU scheme in cores reads as the millicore scheme, bucket for bucket."""

from __future__ import annotations

import numpy as np

from cellpilot.usage.buckets import (
    CPU_SCHEME,
    LEGACY_SCHEMES,
    Resource,
    geometric_scheme,
    legacy_value_scale,
    lookup_scheme,
)
from cellpilot.usage.histogram import Histogram, SparseHistogram

# The scheme histograms were written under while CPU was kept in cores.
LEGACY_CPU = geometric_scheme(
    "cpu-cores-geometric", 1, Resource.CPU, "cores", lowest=1e-3, highest=512.0, buckets=400
)


def test_the_legacy_layout_is_the_millicore_one_divided_by_1000() -> None:
    legacy = LEGACY_SCHEMES[LEGACY_CPU.key()]
    assert legacy.current is CPU_SCHEME
    assert legacy.value_scale == 1000.0
    assert LEGACY_CPU.size == CPU_SCHEME.size
    np.testing.assert_allclose(LEGACY_CPU.boundaries * 1000.0, CPU_SCHEME.boundaries, rtol=1e-12)
    assert legacy_value_scale(*CPU_SCHEME.key()) == 1.0
    assert legacy_value_scale(*LEGACY_CPU.key()) == 1000.0


def test_a_histogram_stored_under_the_legacy_scheme_is_relabelled_with_its_counts() -> None:
    cores = np.array([0.0005, 0.01, 0.25, 0.25, 1.5, 3.0, 64.0, 300.0])
    stored = Histogram.from_values(LEGACY_CPU, 600_000, cores, 300_000).to_sparse().to_bytes()
    read = SparseHistogram.from_bytes(stored)  # no extra schemes: the built-in lookup re-labels
    assert read.scheme is CPU_SCHEME
    assert lookup_scheme(*LEGACY_CPU.key()) is CPU_SCHEME
    fresh = Histogram.from_values(CPU_SCHEME, 600_000, cores * 1000.0, 300_000)
    np.testing.assert_array_equal(read.to_dense().counts, fresh.counts)
    assert (read.start_ms, read.window_ms) == (600_000, 300_000)
