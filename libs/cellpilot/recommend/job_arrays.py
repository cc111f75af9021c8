"""Recommender state as stacked per-job arrays that slice, stack and serialise themselves.

Every recommender state is a frozen dataclass deriving from :class:`JobArrays` whose
fields are numpy arrays with a leading job axis (J, ...), nested ``JobArrays`` states, or
tuples of (``JobArrays`` or ``None``). One job's state is simply J = 1, so the same type
serves the per-job path (a worker loads one job's bytes from Redis) and the batched path
(``concat`` many jobs, update them in one vectorised call, ``take`` them apart again).

Bytes layout (little-endian): magic ``CPST``, u32 header length, a JSON header describing
the tree (class names, dtypes, shapes), then each array's raw bytes in header order.
Module-qualified class names resolve through the registry that :class:`JobArrays`
subclasses join when they are defined, so ``JobArrays.from_bytes`` can rebuild any state tree. No pickle.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from cellpilot.usage.tagged_bytes import read_tagged_length

_MAGIC = b"CPST"
_LEN = struct.Struct("<4sI")
_FORMAT = 1

T = TypeVar("T", bound="JobArrays")


class JobArrays:
    """Mixin for frozen dataclasses of per-job arrays (leading axis = job)."""

    _registry: ClassVar[dict[str, type[JobArrays]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        JobArrays._registry[_type_name(cls)] = cls

    # -- shape -------------------------------------------------------------------------

    @property
    def jobs(self) -> int:
        """Number of jobs J (the leading axis of every array)."""
        for value in self._values():
            found = _jobs_of(value)
            if found is not None:
                return found
        raise ValueError(f"{type(self).__name__} holds no arrays")

    def _values(self) -> list[Any]:
        return [getattr(self, name) for name in _field_names(self)]

    @property
    def nbytes(self) -> int:
        """Bytes held by all arrays (the state's memory footprint)."""
        return _nbytes(self)

    def check_jobs(self) -> None:
        """Raise if the arrays disagree on the number of jobs."""
        seen = {j for j in (_jobs_of(v) for v in self._values()) if j is not None}
        if len(seen) > 1:
            raise ValueError(f"{type(self).__name__} arrays disagree on the job count: {sorted(seen)}")

    # -- slicing -----------------------------------------------------------------------

    def take(self: T, rows: npt.ArrayLike | slice) -> T:
        """The state of the selected jobs (a copy)."""
        index = rows if isinstance(rows, slice) else np.asarray(rows, dtype=np.intp)
        return type(self)(**{name: _take(getattr(self, name), index) for name in _field_names(self)})

    @classmethod
    def concat(cls: type[T], parts: Sequence[T]) -> T:
        """Stack the jobs of several states (same configuration) into one batch."""
        if not parts:
            raise ValueError("need at least one state")
        return cls(**{name: _concat([getattr(p, name) for p in parts]) for name in _field_names(cls)})

    def split(self: T) -> list[T]:
        """One J = 1 state per job."""
        return [self.take(slice(i, i + 1)) for i in range(self.jobs)]

    # -- bytes -------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        arrays: list[npt.NDArray[Any]] = []
        tree = _encode(self, arrays)
        header = json.dumps({"format": _FORMAT, "tree": tree}, separators=(",", ":")).encode()
        payload = [np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes() for a in arrays]
        return b"".join([_LEN.pack(_MAGIC, len(header)), header, *payload])

    @classmethod
    def from_bytes(cls: type[T], data: bytes) -> T:
        view = memoryview(data)
        header_len = read_tagged_length(view, _LEN, _MAGIC, "recommender state")
        header = json.loads(bytes(view[_LEN.size : _LEN.size + header_len]))
        if header.get("format") != _FORMAT:
            raise ValueError(f"unsupported state format {header.get('format')}")
        cursor = [_LEN.size + header_len]
        state = _decode(header["tree"], view, cursor)
        if cursor[0] != len(view):
            raise ValueError("trailing bytes after the state")
        if not isinstance(state, cls):
            raise TypeError(f"bytes hold a {type(state).__name__}, not a {cls.__name__}")
        state.check_jobs()
        return state

    def equals(self, other: JobArrays) -> bool:
        """Exact equality of every array (NaN equal to NaN)."""
        return type(self) is type(other) and _equal(self, other)


def step_inputs(
    counts: npt.ArrayLike,
    time_ms: npt.ArrayLike,
    buckets: int,
    updates: npt.NDArray[Any],
    last_ms: npt.NDArray[Any],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """A recommender step's input as arrays: one histogram per job (``counts`` (J, K)) at event
    times ``time_ms`` (J,), checked against the state's ``updates`` and ``last_ms`` (J,): each
    job's histograms come in event-time order."""
    s = np.asarray(counts, dtype=np.float64)
    t = np.asarray(time_ms, dtype=np.int64)
    jobs = updates.shape[0]
    if s.shape != (jobs, buckets) or t.shape != (jobs,):
        raise ValueError(
            f"expected counts ({jobs}, {buckets}) and time_ms ({jobs},), got {s.shape}, {t.shape}"
        )
    if np.any((updates > 0) & (t < last_ms)):
        raise ValueError("histogram older than the job's latest one: feed each job in event-time order")
    return s, t


def _type_name(cls: type[JobArrays]) -> str:
    """The name a state type is registered and serialised under (module-qualified)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _field_names(obj: JobArrays | type[JobArrays]) -> list[str]:
    """Field names of a JobArrays dataclass (instance or class)."""
    return [f.name for f in fields(obj)]  # type: ignore[arg-type]


def _jobs_of(value: Any) -> int | None:
    if isinstance(value, np.ndarray):
        return int(value.shape[0])
    if isinstance(value, JobArrays):
        return value.jobs
    if isinstance(value, tuple):
        for item in value:
            found = _jobs_of(item)
            if found is not None:
                return found
    return None


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, JobArrays):
        return sum(_nbytes(getattr(value, name)) for name in _field_names(value))
    if isinstance(value, tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _take(value: Any, index: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value[index].copy()
    if isinstance(value, JobArrays):
        return value.take(index)
    if isinstance(value, tuple):
        return tuple(_take(v, index) for v in value)
    raise TypeError(f"unsupported state field {type(value).__name__}")


def _concat(values: list[Any]) -> Any:
    first = values[0]
    if first is None:
        if any(v is not None for v in values):
            raise ValueError("cannot stack a missing sub-state with a present one")
        return None
    if isinstance(first, np.ndarray):
        return np.concatenate(values, axis=0)
    if isinstance(first, JobArrays):
        return type(first).concat(values)
    if isinstance(first, tuple):
        if len({len(v) for v in values}) != 1:
            raise ValueError("states have different numbers of sub-states")
        return tuple(_concat([v[i] for v in values]) for i in range(len(first)))
    raise TypeError(f"unsupported state field {type(first).__name__}")


def _encode(value: Any, arrays: list[npt.NDArray[Any]]) -> Any:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        arrays.append(value)
        return {"dtype": value.dtype.newbyteorder("<").str, "shape": list(value.shape)}
    if isinstance(value, JobArrays):
        return {
            "type": _type_name(type(value)),
            "fields": {name: _encode(getattr(value, name), arrays) for name in _field_names(value)},
        }
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, arrays) for v in value]}
    raise TypeError(f"unsupported state field {type(value).__name__}")


def _decode(node: Any, view: memoryview, cursor: list[int]) -> Any:
    if node is None:
        return None
    if "tuple" in node:
        return tuple(_decode(item, view, cursor) for item in node["tuple"])
    if "type" in node:
        cls = JobArrays._registry.get(node["type"])
        if cls is None:
            raise ValueError(f"unknown state type {node['type']!r}")
        expected = set(_field_names(cls))
        if set(node["fields"]) != expected:
            raise ValueError(f"{node['type']} fields differ from this version's: {sorted(expected)}")
        return cls(**{name: _decode(sub, view, cursor) for name, sub in node["fields"].items()})
    dtype = np.dtype(node["dtype"])
    shape = tuple(int(s) for s in node["shape"])
    count = int(np.prod(shape, dtype=np.int64))
    start = cursor[0]
    end = start + count * dtype.itemsize
    if end > len(view):
        raise ValueError("truncated state payload")
    cursor[0] = end
    array = np.frombuffer(view[start:end], dtype=dtype, count=count).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def _equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        )
    if isinstance(a, JobArrays):
        return type(a) is type(b) and all(_equal(getattr(a, n), getattr(b, n)) for n in _field_names(a))
    if isinstance(a, tuple):
        return (
            isinstance(b, tuple) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return bool(a == b)
