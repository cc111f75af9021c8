"""A named set of numpy arrays plus a small JSON document, as one byte string.

Checkpoints of the Autopilot services (open aggregation windows, batch sequences) are
arrays of different lengths plus a little metadata; :func:`pack` and :func:`unpack` give
them a compact, pickle-free byte form.

Layout (little-endian): magic ``CPAB``, u32 header length, a JSON header
``{"meta": ..., "arrays": [[name, dtype, shape], ...]}``, then each array's raw bytes in
header order.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.usage.tagged_bytes import read_tagged_length

_MAGIC = b"CPAB"
_LEN = struct.Struct("<4sI")


def pack(arrays: Mapping[str, npt.NDArray[Any]], meta: Mapping[str, Any] | None = None) -> bytes:
    spec = []
    payload = []
    for name, array in arrays.items():
        a = np.ascontiguousarray(array)
        little = a.astype(a.dtype.newbyteorder("<"), copy=False)
        spec.append([name, little.dtype.str, list(a.shape)])
        payload.append(little.tobytes())
    header = json.dumps({"meta": dict(meta or {}), "arrays": spec}, separators=(",", ":")).encode()
    return b"".join([_LEN.pack(_MAGIC, len(header)), header, *payload])


def unpack(data: bytes) -> tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]:
    """Inverse of :func:`pack`: (arrays by name, meta). Raises ValueError on malformed input."""
    view = memoryview(data)
    header_len = read_tagged_length(view, _LEN, _MAGIC, "array bundle")
    try:
        header = json.loads(bytes(view[_LEN.size : _LEN.size + header_len]))
    except json.JSONDecodeError as error:
        raise ValueError(f"array bundle header is not JSON: {error}") from error
    offset = _LEN.size + header_len
    arrays: dict[str, npt.NDArray[Any]] = {}
    for name, dtype_str, shape in header["arrays"]:
        dtype = np.dtype(dtype_str)
        count = int(np.prod(shape, dtype=np.int64))
        end = offset + count * dtype.itemsize
        if end > len(view):
            raise ValueError("truncated array bundle payload")
        flat = np.frombuffer(view[offset:end], dtype=dtype, count=count)
        arrays[name] = flat.reshape(shape).astype(dtype.newbyteorder("="), copy=True)
        offset = end
    if offset != len(view):
        raise ValueError("trailing bytes after the array bundle")
    return arrays, dict(header["meta"])
