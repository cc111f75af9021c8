"""A member notices a partition no live member consumes (cellpilot.platform.abandoned_partitions)."""

from __future__ import annotations

from cellpilot.platform.abandoned_partitions import AbandonedPartitions

P0, P1 = ("t", 0), ("t", 1)


def test_a_partition_whose_offset_stays_behind_its_log_is_abandoned_after_the_delay() -> None:
    seen = AbandonedPartitions(after_s=60)
    assert seen.observe(0, set(), {P0: 5}, {P0: 9}) == []
    assert seen.observe(59, set(), {P0: 5}, {P0: 12}) == [], "not yet: 59 s"
    assert seen.observe(60, set(), {P0: 5}, {P0: 12}) == [P0]


def test_an_offset_that_moves_restarts_the_clock() -> None:
    seen = AbandonedPartitions(after_s=60)
    seen.observe(0, set(), {P0: 5}, {P0: 9})
    assert seen.observe(50, set(), {P0: 7}, {P0: 9}) == []
    assert seen.observe(100, set(), {P0: 7}, {P0: 9}) == [], "50 s since it moved"
    assert seen.observe(110, set(), {P0: 7}, {P0: 9}) == [P0]


def test_a_caught_up_or_owned_partition_is_never_abandoned() -> None:
    seen = AbandonedPartitions(after_s=10)
    for now in (0, 20, 40):
        assert seen.observe(now, {P1}, {P0: 9, P1: 0}, {P0: 9, P1: 50}) == []
    assert seen.stalled == {}


def test_a_partition_never_committed_counts_from_zero() -> None:
    seen = AbandonedPartitions(after_s=10)
    seen.observe(0, set(), {P0: None}, {P0: 3})
    assert seen.observe(10, set(), {P0: None}, {P0: 4}) == [P0]
    assert seen.observe(10, set(), {P1: None}, {P1: 0}) == [], "an empty partition waits for nothing"


def test_after_a_rejoin_the_clock_starts_again() -> None:
    seen = AbandonedPartitions(after_s=10)
    seen.observe(0, set(), {P0: 1}, {P0: 3})
    seen.forget()
    assert seen.observe(15, set(), {P0: 1}, {P0: 3}) == []
    assert seen.observe(25, set(), {P0: 1}, {P0: 3}) == [P0]
