"""Link shards (Borg §3.3): the partition of machines over replicas and the report digest."""

from __future__ import annotations

import pytest

from cellpilot.api.v1 import borglet_pb2, resources_pb2, state_pb2
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.link_shards import (
    Membership,
    must_forward,
    next_membership,
    partition,
    report_digest,
    shard_owner,
)
from cellpilot.borg.poll_diff import MachineReport, ReportedEvent, ReportedTask
from cellpilot.borg_wire.borglet_polls import digest_in, report_in
from cellpilot.schedule import Resources

MACHINES = [f"machine-r0-{i:04d}" for i in range(3_000)]
REPLICAS = ("borgmaster-0", "borgmaster-1", "borgmaster-2")


def test_every_machine_has_exactly_one_owner_and_shares_are_balanced() -> None:
    shares = partition(MACHINES, REPLICAS)
    assert sorted(m for share in shares.values() for m in share) == sorted(MACHINES)
    for share in shares.values():
        assert abs(len(share) - len(MACHINES) / 3) < 0.1 * len(MACHINES) / 3


def test_the_partition_depends_on_the_member_set_only() -> None:
    assert partition(MACHINES, REPLICAS) == partition(list(reversed(MACHINES)), tuple(reversed(REPLICAS)))


def test_when_a_replica_leaves_only_its_machines_move() -> None:
    before = partition(MACHINES, REPLICAS)
    after = partition(MACHINES, REPLICAS[:2])
    for member in REPLICAS[:2]:
        assert set(before[member]) <= set(after[member])
    moved = set(after["borgmaster-0"]) - set(before["borgmaster-0"])
    moved |= set(after["borgmaster-1"]) - set(before["borgmaster-1"])
    assert moved == set(before["borgmaster-2"])


def test_a_partition_needs_a_member() -> None:
    with pytest.raises(ValueError, match="members"):
        shard_owner("m", [])


def test_a_non_member_has_no_share() -> None:
    membership = Membership(1, REPLICAS[:2])
    assert membership.share("borgmaster-2", MACHINES) == []
    assert membership.share("borgmaster-0", MACHINES) == partition(MACHINES, REPLICAS[:2])["borgmaster-0"]


@pytest.mark.parametrize(
    ("heard", "expected"),
    [
        ({}, ("borgmaster-0",)),
        ({"borgmaster-1": 99.0, "borgmaster-2": 98.0}, REPLICAS),
        ({"borgmaster-1": 99.0, "borgmaster-2": 50.0}, ("borgmaster-0", "borgmaster-1")),
    ],
    ids=["leader-alone", "all-alive", "one-timed-out"],
)
def test_membership_is_the_leader_and_the_replicas_heard_from_recently(
    heard: dict[str, float], expected: tuple[str, ...]
) -> None:
    current = Membership(7, ("borgmaster-0", "borgmaster-1"))
    got = next_membership(current, "borgmaster-0", heard, now=100.0, timeout=10.0)
    assert got.members == expected
    assert got.version == (7 if expected == current.members else 8)


def _report(
    state: TaskState = TaskState.RUNNING, cpu: float = 50.0, ready: bool = True, **kw: object
) -> MachineReport:
    task = ReportedTask(
        "alice/web", 0, 3, state, TaskEvent.OOM if state is TaskState.DEAD else None, 0,
        Resources(cpu=cpu, ram=1 << 20), ready, 1_000,
    )  # fmt: skip
    events = tuple(kw.get("events", ()))  # type: ignore[call-overload]
    return MachineReport("m", 5_000, int(kw.get("desired_version", 4)), (task,), events)  # type: ignore[call-overload]


BASE = report_digest(_report())


@pytest.mark.parametrize(
    ("report", "changed"),
    [
        (_report(cpu=75.0), False),
        (_report(state=TaskState.DEAD), True),
        (_report(ready=False), True),
        (_report(desired_version=5), True),
        (_report(events=[ReportedEvent(9, "alice/web", 0, 3, TaskEvent.OOM)]), True),
    ],
    ids=["usage-only", "task-exited", "readiness", "desired-version", "new-event"],
)
def test_the_digest_changes_with_what_the_state_machines_act_on_not_with_usage(
    report: MachineReport, changed: bool
) -> None:
    assert (report_digest(report) != BASE) is changed


@pytest.mark.parametrize(
    ("previous", "answered_again", "down", "last_forward", "expected"),
    [
        (BASE, False, False, 9_000, False),
        (None, False, False, None, True),
        (BASE, True, False, 9_000, True),
        (BASE, False, True, 9_000, True),
        (BASE, False, False, 0, True),
    ],
    ids=["unchanged-fresh", "first-report", "answered-again", "machine-down", "refresh-due"],
)
def test_a_shard_forwards_only_differences_and_refreshes(
    previous: object, answered_again: bool, down: bool, last_forward: int | None, expected: bool
) -> None:
    got = must_forward(
        previous,  # type: ignore[arg-type]
        BASE,
        answered_again=answered_again,
        machine_down=down,
        last_forward_ms=last_forward,
        now_ms=10_000,
        refresh_ms=5_000,
    )
    assert got is expected


def test_events_already_recorded_are_no_news() -> None:
    with_event = _report(events=[ReportedEvent(9, "alice/web", 0, 3, TaskEvent.OOM)])
    assert report_digest(with_event, acked_sequence=9) == BASE
    assert report_digest(with_event, acked_sequence=8) != BASE


def test_the_digest_read_off_the_poll_message_is_the_reports_digest() -> None:
    """A link shard digests every poll straight off the message (no usage converted); it must
    be the digest of the converted report, or a shard would forward too much or too little."""
    usage = resources_pb2.Resources(cpu_millicores=300, memory_bytes=1 << 20)
    response = borglet_pb2.PollResponse(
        machine_id="m0",
        desired_version=7,
        tasks=[
            borglet_pb2.TaskReport(
                job_id="a/web",
                task_index=0,
                incarnation=2,
                state=state_pb2.TASK_STATE_RUNNING,
                usage=usage,
                ready=True,
            ),
            borglet_pb2.TaskReport(
                job_id="a/web",
                task_index=1,
                incarnation=1,
                state=state_pb2.TASK_STATE_DEAD,
                exit_reason=state_pb2.TASK_EVENT_KIND_FAILED,
                exit_code=3,
            ),
        ],
        events=[
            borglet_pb2.ReportedEvent(
                sequence=s,
                event=state_pb2.TaskEvent(
                    job_id="a/web", task_index=1, kind=state_pb2.TASK_EVENT_KIND_FAILED
                ),
            )
            for s in (4, 9)
        ],
    )
    for acked in (0, 4, 9):
        assert digest_in(response, acked) == report_digest(report_in(response), acked)
    moved = borglet_pb2.PollResponse()
    moved.CopyFrom(response)
    moved.tasks[0].usage.cpu_millicores = 900  # usage is not news
    assert digest_in(moved) == digest_in(response)
    moved.tasks[1].exit_reason = state_pb2.TASK_EVENT_KIND_OOM  # how a task ended is
    assert digest_in(moved) != digest_in(response)
