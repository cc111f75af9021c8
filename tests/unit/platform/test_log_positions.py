"""Stored consumer positions checked against a partition's log (cellpilot.platform.kafka).

A position is the next offset to apply and the fingerprint of the last applied record. It
belongs to the partition's log while the log reaches it and holds that very record just
before it; a log that was lost and began again (a memory-only broker restarted, a topic
created again) fails the check even once it has grown past the position.
"""

from __future__ import annotations

import pytest

from cellpilot.platform.kafka import (
    AppliedOffsets,
    LogPosition,
    Record,
    RecordFingerprint,
    offset_to_read,
    stale_position_reason,
)

APPLIED = RecordFingerprint(1_700_000_000_000, "a1b2c3d4e5f60718")
OTHER = RecordFingerprint(1_700_000_999_000, "ffffeeeeddddcccc")


def record(offset: int, value: bytes = b"v", key: str = "job-1", ts: int = 1_700_000_000_000) -> Record:
    return Record("t", 0, offset, key, value, (), ts)


@pytest.mark.parametrize(
    ("position", "start", "expected"),
    [
        (LogPosition(0), 0, None),
        (LogPosition(5, None), 0, 4),
        (LogPosition(5, APPLIED), 0, 4),
        (LogPosition(5, APPLIED), 5, None),
        (LogPosition(5, APPLIED), 4, 4),
    ],
    ids=["nothing-applied", "no-fingerprint-reads-the-end", "the-last-applied", "retired", "first-kept"],
)
def test_which_record_a_check_reads(position: LogPosition, start: int, expected: int | None) -> None:
    assert offset_to_read(position, start) == expected


@pytest.mark.parametrize(
    ("position", "start", "end", "read", "stale"),
    [
        (LogPosition(0), 0, 0, ..., False),
        (LogPosition(387), 0, 3, ..., True),
        (LogPosition(387, APPLIED), 0, 3, ..., True),
        (LogPosition(5, APPLIED), 0, 500, APPLIED, False),
        (LogPosition(5, APPLIED), 0, 500, OTHER, True),
        (LogPosition(5, APPLIED), 0, 500, None, True),
        (LogPosition(5, APPLIED), 0, 500, ..., False),
        (LogPosition(5), 0, 500, ..., False),
        (LogPosition(5, APPLIED), 0, 5, APPLIED, False),
        (LogPosition(5, APPLIED), 7, 500, ..., False),
    ],
    ids=[
        "empty-log-nothing-applied",
        "log-shorter-than-a-bare-offset",
        "log-shorter-than-the-position",
        "same-record-same-log",
        "another-record-the-new-log-grew-past",
        "no-record-there",
        "record-not-read-yet",
        "bare-offset-inside-the-log-cannot-tell",
        "caught-up-at-the-log-end",
        "below-the-log-start-retention",
    ],
)
def test_a_position_is_stale_only_when_its_log_is_gone(
    position: LogPosition, start: int, end: int, read: object, stale: bool
) -> None:
    reason = stale_position_reason(position, start, end, read)  # type: ignore[arg-type]
    assert (reason is not None) == stale, reason


def test_the_fingerprint_tells_records_apart_by_key_value_and_time() -> None:
    base = RecordFingerprint.of(record(3))
    assert RecordFingerprint.of(record(99)) == base, "the offset is not part of it: the check reads it there"
    assert RecordFingerprint.of(record(3, value=b"w")) != base
    assert RecordFingerprint.of(record(3, key="job-2")) != base
    assert RecordFingerprint.of(record(3, ts=1)) != base
    assert RecordFingerprint.of(record(3, key="a", value=b"b")) != RecordFingerprint.of(
        record(3, key="ab", value=b"")
    ), "key and value are separated"


def test_mark_remembers_the_last_applied_record_and_reset_forgets_it() -> None:
    fence = AppliedOffsets()
    for offset in range(3):
        fence.mark(record(offset, value=bytes([offset])))
    fence.mark(record(1, value=b"again"))  # a redelivered record does not move the position back
    assert fence.position(("t", 0)) == LogPosition(3, RecordFingerprint.of(record(2, value=bytes([2]))))
    assert not fence.is_new(record(2))
    assert fence.is_new(record(3))
    fence.reset(("t", 0), 0)
    assert fence.position(("t", 0)) == LogPosition(0, None)
    assert fence.is_new(record(0)), "the new log's records are applied"


def test_positions_survive_their_stored_form_including_bare_offsets_stored_before() -> None:
    fence = AppliedOffsets()
    fence.mark(record(41))
    fence.next_offset[("u", 2)] = 7  # a position without a fingerprint
    stored = fence.to_mapping()
    assert stored["t/0"] == f"42@{RecordFingerprint.of(record(41)).encode()}"
    assert stored["u/2"] == "7"
    assert AppliedOffsets.from_mapping(stored) == fence
    legacy = AppliedOffsets.from_mapping({"t/0": 42, "v.w/1": b"3"})
    assert legacy.position(("t", 0)) == LogPosition(42, None)
    assert legacy.position(("v.w", 1)) == LogPosition(3, None)
