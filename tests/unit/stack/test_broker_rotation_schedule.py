"""When ``cellpilot run`` rotates the embedded broker's topics (it honours no retention itself)."""

from __future__ import annotations

from cellpilot.platform.topics import TOPICS, Topic
from cellpilot.stack.broker_retention import RETRY_AFTER_S, RotationSchedule

SAMPLES = Topic("s", 6, "machine id", "samples", retention_ms=600_000)
WINDOWS = Topic("w", 6, "job id", "windows", retention_ms=1_800_000)
EVENTS = Topic("e", 3, "job id", "events")  # no retention: kept


def test_each_topic_with_a_retention_is_due_that_long_after_the_broker_started() -> None:
    schedule = RotationSchedule.starting(1_000.0, [SAMPLES, WINDOWS, EVENTS])
    assert schedule.due(1_000.0 + 599) == []
    assert schedule.due(1_000.0 + 600) == [SAMPLES]
    assert schedule.due(1_000.0 + 1_800) == [SAMPLES, WINDOWS]
    assert "e" not in schedule.due_at, "a topic without a retention is never rotated"


def test_a_rotation_restarts_the_count_and_a_failed_one_is_tried_again_later() -> None:
    schedule = RotationSchedule.starting(0.0, [SAMPLES, WINDOWS])
    schedule.rotated(SAMPLES, 600.0)
    assert schedule.due(1_199.0) == []
    assert schedule.due(1_200.0) == [SAMPLES]
    schedule.failed(SAMPLES, 1_200.0)
    assert schedule.due(1_200.0 + RETRY_AFTER_S - 1) == []
    assert schedule.due(1_200.0 + RETRY_AFTER_S) == [SAMPLES]


def test_the_cells_topics_rotate_the_raw_samples_first_and_keep_events_and_actuations() -> None:
    schedule = RotationSchedule.starting(0.0)
    rotated = dict(schedule.due_at)
    assert rotated["usage.samples"] == min(rotated.values())
    assert {"borg.events", "actuations", "deadletter"}.isdisjoint(rotated)
    assert {t.name for t in TOPICS if t.retention_ms} == set(rotated)


def test_what_a_group_had_not_applied_is_counted_per_partition_and_never_negative() -> None:
    from aiokafka import TopicPartition

    from cellpilot.stack.broker_retention import Rotation, unapplied

    ends = {TopicPartition("s", 0): 10, TopicPartition("s", 1): 4}
    assert unapplied(ends, {TopicPartition("s", 0): 7, TopicPartition("s", 1): 4}) == 3
    assert unapplied(ends, {TopicPartition("s", 0): 12}) == 4, "a partition never committed counts whole"
    assert "aggregator 3" in Rotation(14, {"aggregator": 3}).describe()
    assert "own state" in Rotation(14, {}).describe(), "consumers invisible to the broker are named as such"


def test_a_rotation_or_a_failure_ends_the_drain() -> None:
    from cellpilot.stack.broker_retention import Drain

    schedule = RotationSchedule.starting(0.0, [SAMPLES])
    schedule.draining["s"] = Drain(600.0, {})
    schedule.rotated(SAMPLES, 630.0)
    assert "s" not in schedule.draining
    schedule.draining["s"] = Drain(1_230.0, {})
    schedule.failed(SAMPLES, 1_240.0)
    assert "s" not in schedule.draining
