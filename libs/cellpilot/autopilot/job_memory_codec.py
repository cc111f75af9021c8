"""Bytes form of the master's per-job :class:`~cellpilot.autopilot.decisions.JobMemory`.

The elected Autopilot master persists what it last sent and the horizontal stabiliser's
state per job, so a newly elected master continues where the old one stopped (deferred
downscaling keeps its window, slow decay its start) instead of starting from scratch.

Layout: a JSON document (UTF-8) for the scalar fields; the stabiliser's arrays, when
present, as :meth:`JobArrays.to_bytes` after a 4-byte little-endian length of the JSON.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from cellpilot.autopilot.decisions import JobMemory, SentTarget
from cellpilot.recommend.horizontal import HorizontalReason, StabiliserState

_LEN = struct.Struct("<I")


def _sent_out(sent: SentTarget | None) -> list[Any] | None:
    return None if sent is None else [sent.value, sent.event_ms, sent.key]


def _sent_in(raw: Any) -> SentTarget | None:
    if raw is None:
        return None
    value, event_ms, key = raw
    return SentTarget(float(value), int(event_ms), str(key))


def encode_memory(memory: JobMemory) -> bytes:
    doc = {
        "cpu": _sent_out(memory.cpu),
        "memory": _sent_out(memory.memory),
        "tasks": _sent_out(memory.tasks),
        "released": _sent_out(memory.released),
        "stabiliser_slots": memory.stabiliser_slots,
        "horizontal_input_ms": memory.horizontal_input_ms,
        "horizontal_target": memory.horizontal_target,
        "horizontal_raw": memory.horizontal_raw,
        "horizontal_reason": int(memory.horizontal_reason),
    }
    head = json.dumps(doc, separators=(",", ":")).encode()
    tail = memory.stabiliser.to_bytes() if memory.stabiliser is not None else b""
    return _LEN.pack(len(head)) + head + tail


def decode_memory(data: bytes) -> JobMemory:
    """Inverse of :func:`encode_memory`; raises ValueError on malformed bytes."""
    if len(data) < _LEN.size:
        raise ValueError("truncated job memory")
    (head_len,) = _LEN.unpack_from(data, 0)
    end = _LEN.size + head_len
    if end > len(data):
        raise ValueError("truncated job memory header")
    try:
        doc = json.loads(data[_LEN.size : end])
    except json.JSONDecodeError as error:
        raise ValueError(f"job memory header is not JSON: {error}") from error
    stabiliser = StabiliserState.from_bytes(data[end:]) if end < len(data) else None
    target = doc["horizontal_target"]
    raw = doc["horizontal_raw"]
    return JobMemory(
        cpu=_sent_in(doc["cpu"]),
        memory=_sent_in(doc["memory"]),
        tasks=_sent_in(doc["tasks"]),
        released=_sent_in(doc["released"]),
        stabiliser=stabiliser,
        stabiliser_slots=int(doc["stabiliser_slots"]),
        horizontal_input_ms=int(doc["horizontal_input_ms"]),
        horizontal_target=None if target is None else int(target),
        horizontal_raw=None if raw is None else float(raw),
        horizontal_reason=HorizontalReason(int(doc["horizontal_reason"])),
    )
