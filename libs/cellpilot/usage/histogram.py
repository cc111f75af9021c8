"""One usage histogram: the aggregated signal s_i[t] or s[t] of Autopilot §3.2.1.

A histogram covers one window [start_ms, start_ms + window_ms) of event time and counts
samples per bucket of a :class:`~cellpilot.usage.buckets.BucketScheme`. Counts are float64
so that the same type can hold sums of task histograms and decayed sums.

Two layouts: :class:`Histogram` (dense, one count per bucket, what the recommenders
consume) and :class:`SparseHistogram` (non-zero buckets only, what goes on the wire: a
5-minute CPU histogram of one task touches a few dozen of the ~400 buckets). Both
serialise to a compact little-endian byte string that names the bucket scheme.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int32Array
from cellpilot.usage.buckets import BucketScheme, lookup_scheme
from cellpilot.usage.tagged_bytes import read_tagged_length

DEFAULT_WINDOW_MS = 5 * 60 * 1000  # §3.2.1: "aggregates values over, typically, 5 minute windows"

_MAGIC = b"CPH1"
_HEADER = struct.Struct("<4sH")  # magic, scheme id length
_BODY = struct.Struct("<IqqI")  # scheme version, start_ms, window_ms, non-zero buckets


@dataclass(frozen=True, eq=False)
class HistogramWindow:
    """What both layouts share: the bucket scheme and the window [start_ms, start_ms + window_ms)."""

    scheme: BucketScheme
    start_ms: int
    window_ms: int

    def __post_init__(self) -> None:
        """Check the window and keep its bounds as plain ints."""
        if self.window_ms <= 0:
            raise ValueError("window_ms must be positive")
        if not isinstance(self.start_ms, int | np.integer):
            raise TypeError("start_ms must be an integer (event time in ms)")
        object.__setattr__(self, "start_ms", int(self.start_ms))
        object.__setattr__(self, "window_ms", int(self.window_ms))

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.window_ms


@dataclass(frozen=True, eq=False)
class Histogram(HistogramWindow):
    """Dense histogram: ``counts[k]`` samples fell in bucket k during the window."""

    counts: FloatArray

    def __post_init__(self) -> None:
        super().__post_init__()
        counts = np.array(self.counts, dtype=np.float64, copy=True)
        if counts.shape != (self.scheme.size,):
            raise ValueError(f"counts must have shape ({self.scheme.size},), got {counts.shape}")
        if np.any(~np.isfinite(counts)) or np.any(counts < 0.0):
            raise ValueError("counts must be finite and non-negative")
        counts.setflags(write=False)
        object.__setattr__(self, "counts", counts)

    @classmethod
    def empty(cls, scheme: BucketScheme, start_ms: int, window_ms: int = DEFAULT_WINDOW_MS) -> Histogram:
        return cls(scheme, start_ms, window_ms, np.zeros(scheme.size))

    @classmethod
    def from_values(
        cls,
        scheme: BucketScheme,
        start_ms: int,
        values: npt.ArrayLike,
        window_ms: int = DEFAULT_WINDOW_MS,
    ) -> Histogram:
        """Counts every value (the CPU rule of §3.2.1) in one window."""
        idx = scheme.index_of(np.ravel(np.asarray(values, dtype=np.float64)))
        return cls(scheme, start_ms, window_ms, np.bincount(idx, minlength=scheme.size).astype(np.float64))

    @classmethod
    def from_peak(
        cls,
        scheme: BucketScheme,
        start_ms: int,
        values: npt.ArrayLike,
        window_ms: int = DEFAULT_WINDOW_MS,
    ) -> Histogram:
        """Records only the window's peak (the memory rule of §3.2.1); empty if no values."""
        arr = np.ravel(np.asarray(values, dtype=np.float64))
        counts = np.zeros(scheme.size)
        if arr.size:
            counts[int(scheme.index_of(arr.max()))] = 1.0
        return cls(scheme, start_ms, window_ms, counts)

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    @property
    def is_empty(self) -> bool:
        return not bool(np.any(self.counts > 0.0))

    def mean(self) -> float:
        """Average usage, the s-bar of eq. 2: sum_j b[j] s[j] / sum_j s[j] (NaN if empty)."""
        total = self.total
        return float(self.counts @ self.scheme.boundaries / total) if total > 0.0 else float("nan")

    def peak(self) -> float:
        """b[j] of the highest non-empty bucket (NaN if empty)."""
        nonzero = np.flatnonzero(self.counts)
        return float(self.scheme.boundaries[nonzero[-1]]) if nonzero.size else float("nan")

    def to_sparse(self) -> SparseHistogram:
        nonzero = np.flatnonzero(self.counts).astype(np.int32)
        return SparseHistogram(self.scheme, self.start_ms, self.window_ms, nonzero, self.counts[nonzero])

    def to_bytes(self) -> bytes:
        return self.to_sparse().to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, schemes: Iterable[BucketScheme] = ()) -> Histogram:
        return SparseHistogram.from_bytes(data, schemes).to_dense()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return (
            self.scheme == other.scheme
            and (self.start_ms, self.window_ms) == (other.start_ms, other.window_ms)
            and np.array_equal(self.counts, other.counts)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value: equality, no hashing


@dataclass(frozen=True, eq=False)
class SparseHistogram(HistogramWindow):
    """Non-zero buckets only: ``indices`` strictly increasing, ``counts`` positive."""

    indices: Int32Array
    counts: FloatArray

    def __post_init__(self) -> None:
        super().__post_init__()
        indices = np.array(self.indices, dtype=np.int32, copy=True)
        counts = np.array(self.counts, dtype=np.float64, copy=True)
        if indices.ndim != 1 or indices.shape != counts.shape:
            raise ValueError("indices and counts must be 1-d arrays of the same length")
        if indices.size and (
            indices[0] < 0 or indices[-1] >= self.scheme.size or np.any(np.diff(indices) <= 0)
        ):
            raise ValueError("indices must be strictly increasing bucket indices of the scheme")
        if np.any(~np.isfinite(counts)) or np.any(counts <= 0.0):
            raise ValueError("sparse counts must be finite and positive")
        indices.setflags(write=False)
        counts.setflags(write=False)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "counts", counts)

    def to_dense(self) -> Histogram:
        counts = np.zeros(self.scheme.size)
        counts[self.indices] = self.counts
        return Histogram(self.scheme, self.start_ms, self.window_ms, counts)

    def to_bytes(self) -> bytes:
        """Little-endian: magic, scheme id, scheme version, start, window, nnz, indices, counts."""
        scheme_id = self.scheme.scheme_id.encode()
        return b"".join(
            (
                _HEADER.pack(_MAGIC, len(scheme_id)),
                scheme_id,
                _BODY.pack(self.scheme.version, self.start_ms, self.window_ms, self.indices.size),
                self.indices.astype("<u4").tobytes(),
                self.counts.astype("<f8").tobytes(),
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes, schemes: Iterable[BucketScheme] = ()) -> SparseHistogram:
        """Inverse of :meth:`to_bytes`; ``schemes`` adds schemes beyond the built-in ones."""
        view = memoryview(data)
        id_len = read_tagged_length(view, _HEADER, _MAGIC, "histogram")
        offset = _HEADER.size
        scheme_id = bytes(view[offset : offset + id_len]).decode()
        offset += id_len
        if len(view) < offset + _BODY.size:
            raise ValueError("truncated histogram")
        version, start_ms, window_ms, nnz = _BODY.unpack_from(view, offset)
        offset += _BODY.size
        if len(view) != offset + 12 * nnz:
            raise ValueError("histogram payload length does not match its bucket count")
        indices = np.frombuffer(view, dtype="<u4", count=nnz, offset=offset).astype(np.int32)
        counts = np.frombuffer(view, dtype="<f8", count=nnz, offset=offset + 4 * nnz).astype(np.float64)
        return cls(lookup_scheme(scheme_id, version, schemes), start_ms, window_ms, indices, counts)


def sum_histograms(histograms: Sequence[Histogram]) -> Histogram:
    """The per-job histogram s[t][k] = sum_i s_i[t][k] (§3.2.1) of same-window task histograms."""
    if not histograms:
        raise ValueError("need at least one histogram")
    first = histograms[0]
    for hist in histograms[1:]:
        if hist.scheme != first.scheme or (hist.start_ms, hist.window_ms) != (
            first.start_ms,
            first.window_ms,
        ):
            raise ValueError("can only sum histograms of the same scheme and window")
    total = np.sum([h.counts for h in histograms], axis=0)
    return Histogram(first.scheme, first.start_ms, first.window_ms, total)


def stack_counts(histograms: Sequence[Histogram]) -> FloatArray:
    """Dense ``(n, K)`` count matrix of same-scheme histograms (the recommenders' batch input)."""
    if not histograms:
        raise ValueError("need at least one histogram")
    scheme = histograms[0].scheme
    if any(h.scheme != scheme for h in histograms):
        raise ValueError("histograms use different bucket schemes")
    return np.stack([h.counts for h in histograms]).astype(np.float64, copy=False)
