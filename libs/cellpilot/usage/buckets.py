"""Fixed bucket schemes for usage histograms (Autopilot §3.2.1).

A scheme is the list of bucket boundaries b[0] < b[1] < ... < b[K-1]. Following the
paper's definition of s_i[t][k] (§3.2.1), bucket k holds the values v with
b[k-1] <= v < b[k] (with b[-1] = 0), and the *value* of bucket k is its upper boundary
b[k] (Table 1: "b[k] the value of k-th bin (boundary value)"). Using the upper boundary
is what makes S_max never fall below an observed peak. Values at or above the last
boundary are counted in the last bucket (the schemes below reach far beyond any real
task, so that overflow is a guard, not a use case).

The paper says the monitoring system fixes about 400 boundaries; it does not give them.
We use geometric boundaries, so every bucket has the same relative width
(b[k] - b[k-1]) / b[k-1]: the relative precision of a recommendation is then the same for
a 10-millicore task as for a 100-core one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, IntpArray
from cellpilot.units import MILLICORES_PER_CORE, TIB


class Resource(StrEnum):
    """The two resources Autopilot scales vertically (§2.3)."""

    CPU = "cpu"
    MEMORY = "memory"


@dataclass(frozen=True, eq=False)
class BucketScheme:
    """A named, versioned, immutable list of bucket boundaries.

    ``scheme_id`` and ``version`` travel with every serialised histogram so a reader can
    check it interprets bucket indices with the boundaries they were built with.
    """

    scheme_id: str
    version: int
    resource: Resource
    unit: str
    boundaries: FloatArray

    def __post_init__(self) -> None:
        bounds = np.array(self.boundaries, dtype=np.float64, copy=True)
        if bounds.ndim != 1 or bounds.size < 1:
            raise ValueError("boundaries must be a non-empty 1-d array")
        if not np.all(np.isfinite(bounds)) or bounds[0] <= 0.0:
            raise ValueError("boundaries must be finite and positive")
        if np.any(np.diff(bounds) <= 0.0):
            raise ValueError("boundaries must be strictly increasing")
        if bounds.size > np.iinfo(np.int32).max:
            raise ValueError("too many buckets")
        bounds.setflags(write=False)
        object.__setattr__(self, "boundaries", bounds)

    @property
    def size(self) -> int:
        """Number of buckets K."""
        return int(self.boundaries.size)

    @property
    def lowest(self) -> float:
        return float(self.boundaries[0])

    @property
    def highest(self) -> float:
        return float(self.boundaries[-1])

    def index_of(self, values: npt.ArrayLike) -> IntpArray:
        """Bucket index of each value (vectorised): k such that b[k-1] <= v < b[k].

        Negative values land in bucket 0; values >= the last boundary in the last bucket.
        """
        arr = np.asarray(values, dtype=np.float64)
        if np.any(np.isnan(arr)):
            raise ValueError("usage values must not be NaN")
        idx = np.searchsorted(self.boundaries, arr, side="right")
        return np.minimum(idx, self.size - 1).astype(np.intp, copy=False)

    def value_of(self, index: npt.ArrayLike) -> FloatArray:
        """The value b[k] of bucket k (its upper boundary), vectorised."""
        return np.asarray(self.boundaries[np.asarray(index, dtype=np.intp)], dtype=np.float64)

    def relative_widths(self) -> FloatArray:
        """(b[k] - b[k-1]) / b[k-1] for k >= 1 (bucket 0 starts at 0 and has no relative width)."""
        return np.asarray(np.diff(self.boundaries) / self.boundaries[:-1], dtype=np.float64)

    def key(self) -> tuple[str, int]:
        return (self.scheme_id, self.version)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BucketScheme):
            return NotImplemented
        return (
            self.key() == other.key()
            and self.resource == other.resource
            and self.unit == other.unit
            and np.array_equal(self.boundaries, other.boundaries)
        )

    def __hash__(self) -> int:
        return hash((self.scheme_id, self.version, self.resource, self.unit, self.size))

    def __repr__(self) -> str:
        return (
            f"BucketScheme({self.scheme_id!r} v{self.version}, {self.resource.value}, {self.size} buckets "
            f"{self.lowest:g}..{self.highest:g} {self.unit})"
        )


def geometric_scheme(
    scheme_id: str,
    version: int,
    resource: Resource,
    unit: str,
    *,
    lowest: float,
    highest: float,
    buckets: int,
    integral: bool = False,
) -> BucketScheme:
    """``buckets`` boundaries growing by a constant ratio from ``lowest`` to exactly ``highest``.

    With ``integral`` the boundaries are rounded to whole units (bytes), keeping them
    strictly increasing.
    """
    if buckets < 2 or not 0.0 < lowest < highest:
        raise ValueError("need buckets >= 2 and 0 < lowest < highest")
    exponents = np.linspace(0.0, 1.0, buckets)
    bounds = lowest * (highest / lowest) ** exponents
    bounds[0], bounds[-1] = lowest, highest
    if integral:
        bounds = np.round(bounds)
        if np.any(np.diff(bounds) <= 0.0):
            raise ValueError("integral rounding merged boundaries: raise lowest or lower buckets")
    return BucketScheme(scheme_id, version, resource, unit, bounds)


# CPU in millicores (the unit of the wire and of every core module, cellpilot.units):
# 1 millicore .. 512 cores in 400 buckets, a constant relative width of
# 512000 ** (1/399) - 1 = 3.35 % (the issue asks for <= 5 % and >= 256 cores; §2.3 notes
# Borg expresses CPU in milli-cores, so 1 milli-core is the finest meaningful unit).
CPU_SCHEME = geometric_scheme(
    "cpu-millicores-geometric",
    1,
    Resource.CPU,
    "millicores",
    lowest=1.0,
    highest=512.0 * MILLICORES_PER_CORE,
    buckets=400,
)

# Memory in bytes: 1 MiB .. 2 TiB in 400 whole-byte buckets, relative width
# 2 ** (21/399) - 1 = 3.7 % (the issue asks for the same precision up to >= 1 TiB).
MEMORY_SCHEME = geometric_scheme(
    "memory-bytes-geometric",
    1,
    Resource.MEMORY,
    "bytes",
    lowest=float(2**20),
    highest=float(2 * TIB),
    buckets=400,
    integral=True,
)

KNOWN_SCHEMES: tuple[BucketScheme, ...] = (CPU_SCHEME, MEMORY_SCHEME)


def default_scheme(resource: Resource) -> BucketScheme:
    """The fixed scheme the aggregator uses for ``resource``."""
    return CPU_SCHEME if resource is Resource.CPU else MEMORY_SCHEME


@dataclass(frozen=True)
class LegacyScheme:
    """A scheme no longer written whose histograms are still read: bucket k of it is bucket k
    of ``current``, and a value stated in its unit is ``value_scale`` of the current unit."""

    current: BucketScheme
    value_scale: float


# "cpu-cores-geometric" v1 held CPU in cores (1e-3 .. 512 cores, 400 geometric buckets): the
# millicore scheme divided by 1000, bucket for bucket. A histogram stored under it (the
# aggregator's history, Kafka, checkpoints) keeps its counts and is re-labelled on read.
LEGACY_SCHEMES: dict[tuple[str, int], LegacyScheme] = {
    ("cpu-cores-geometric", 1): LegacyScheme(CPU_SCHEME, float(MILLICORES_PER_CORE)),
}


def legacy_value_scale(scheme_id: str, version: int) -> float:
    """What a value stored alongside a histogram of this scheme is multiplied by to be in the
    current scheme's unit (1 for a current scheme)."""
    legacy = LEGACY_SCHEMES.get((scheme_id, version))
    return 1.0 if legacy is None else legacy.value_scale


def lookup_scheme(scheme_id: str, version: int, extra: Iterable[BucketScheme] = ()) -> BucketScheme:
    """Find a scheme by id and version among the built-in ones and ``extra``; a legacy id
    (:data:`LEGACY_SCHEMES`) gives the current scheme its histograms are re-labelled to."""
    for scheme in (*KNOWN_SCHEMES, *extra):
        if scheme.key() == (scheme_id, version):
            return scheme
    legacy = LEGACY_SCHEMES.get((scheme_id, version))
    if legacy is not None:
        return legacy.current
    raise KeyError(f"unknown bucket scheme {scheme_id!r} version {version}")
