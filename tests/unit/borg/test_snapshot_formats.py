"""Snapshots in a message of their own (``CellSnapshot``), and the first format still read.

Every kind of state round-trips exactly through the format written now, and the log continues
from the restored state as from the original; a first-format snapshot — written by the old
encoder (the committed fixture) or by the encoder kept to compare the formats — loads into the
state its log replays to.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from borg_builders import Master, replay
from snapshot_states import STATES, down_while_draining

from cellpilot.api.v1 import checkpoint_pb2
from cellpilot.borg.cell_state import CellState
from cellpilot.borg.lifecycle import JobState, MachineState, TaskEvent, TaskState
from cellpilot.borg.mutations import LogRecord, MachineRegistered
from cellpilot.borg_wire import checkpoint as checkpoint_codec
from cellpilot.borg_wire import snapshot_v1
from cellpilot.platform.request_validation import InvalidField

FIXTURE = Path(__file__).parent / "fixtures" / "snapshot_v1"


def restorable(state: CellState) -> dict[str, Any]:
    """Everything of a state a restore must give back: the logical state, the indexes and the
    quota book built from it, and where it stands in the log."""
    return {
        **state.describe(),
        "counts": {job_id: dict(job.counts) for job_id, job in sorted(state.jobs.items())},
        # Jobs still rolling out (the index may keep a job whose last outdated task was lost
        # with its machine until its next task change; a restore keeps only those that roll).
        "rolling": sorted(
            job_id
            for job_id in state.rolling
            if any(
                t.state is TaskState.RUNNING and t.spec_version < state.jobs[job_id].spec_version
                for t in state.jobs[job_id].tasks.values()
            )
        ),
        "quota_used": {
            key: state.quota_used(*key)
            for key in sorted(
                {*state.quotas, *((j.spec.user, j.spec.effective_band) for j in state.jobs.values())}
            )
        },
        "event_time_ms": state.event_time_ms,
        "last_epoch": state.last_epoch,
    }


def _through_cell_snapshot(state: CellState) -> CellState:
    data = checkpoint_codec.snapshot_out(state, state.last_epoch).SerializeToString()
    return checkpoint_codec.snapshot_in(data, checkpoint_codec.SNAPSHOT_FORMAT)


def _through_first_format(state: CellState) -> CellState:
    data = snapshot_v1.snapshot_out(state, state.last_epoch).SerializeToString()
    return checkpoint_codec.snapshot_in(data, snapshot_v1.FORMAT)


@pytest.mark.parametrize("name", list(STATES))
def test_a_state_round_trips_exactly_through_the_cell_snapshot_and_the_log_continues(name: str) -> None:
    master = STATES[name]()
    assert restorable(_through_cell_snapshot(master.state)) == restorable(master.state)
    for cut in range(len(master.log) + 1):
        at_cut = replay(master.log[:cut])
        restored = _through_cell_snapshot(at_cut)
        assert restorable(restored) == restorable(at_cut), f"{name}: restored at {cut}"
        restored.apply_all(master.log[cut:])
        assert restorable(restored) == restorable(master.state), f"{name}: continued from {cut}"


def test_the_states_hold_every_kind_of_record() -> None:
    """The table above is only as good as what its states hold."""
    states = [build().state for build in STATES.values()]
    tasks = [(job, task) for state in states for job, task in state.iter_tasks()]
    machines = [machine for state in states for machine in state.machines.values()]
    kinds = {
        "held job": any(j.state is JobState.HELD_FOR_AUTOPILOT for s in states for j in s.jobs.values()),
        "dead job": any(j.state is JobState.DEAD for s in states for j in s.jobs.values()),
        "rolling update": any(
            t.state is TaskState.RUNNING and t.spec_version < j.spec_version for j, t in tasks
        ),
        "task limits not the spec's": any(t.limits != j.spec.task.limits for j, t in tasks),
        "dead task past task_count": any(t.index >= j.spec.task_count for j, t in tasks),
        "backoff": any(t.failures and t.not_before_ms for _, t in tasks),
        "avoided machine": any(t.avoid for _, t in tasks),
        "recent failures": any(t.recent_failures for _, t in tasks),
        "gave up": any(t.reason is TaskEvent.FAILED_FOR_GOOD for _, t in tasks),
        "ports": any(t.ports for _, t in tasks),
        "draining machine": any(m.draining and m.state is MachineState.UP for m in machines),
        "down machine": any(m.state is MachineState.DOWN for m in machines),
        "down while draining": any(m.draining and m.state is MachineState.DOWN for m in machines),
        "LAVA hosts": any(s.lava_hosts for s in states),
        "lifetime model": any(s.lifetime_model is not None for s in states),
        "leader": any(s.leader is not None for s in states),
        "quota below use": any(
            any(u > q for u, q in zip(s.quota_used(*key).array(), limit.array(), strict=True))
            for s in states
            for key, limit in s.quotas.items()
        ),
        "applied request with method and digest": any(
            a.method and a.digest for s in states for a in s.applied_requests.values()
        ),
    }
    assert [kind for kind, present in kinds.items() if not present] == []


def test_what_the_api_shows_beside_the_state_is_not_stored() -> None:
    """No message the API answers with is part of a CellSnapshot, so a change to what the API
    shows cannot change the stored format; nor is any derived or soft field."""
    api_answers = {"JobStatus", "TaskStatus", "Machine", "Quota", "LeaderInfo", "TaskCounts"}
    reached: set[str] = set()
    names: set[str] = set()

    def walk(descriptor: Any) -> None:
        if descriptor.full_name in reached:
            return
        reached.add(descriptor.full_name)
        for field in descriptor.fields:
            names.add(field.name)
            if field.message_type is not None:
                walk(field.message_type)

    walk(checkpoint_pb2.CellSnapshot.DESCRIPTOR)
    assert {name.rsplit(".", 1)[-1] for name in reached} & api_answers == set()
    derived = {
        "usage",
        "reservation",
        "reserved",
        "allocated",
        "task_counts",
        "ready",
        "used",
        "last_contact_ms",
    }
    assert names & derived == set()


@pytest.mark.parametrize("name", [n for n in STATES if n != "down while draining"])
def test_a_first_format_snapshot_loads_into_the_same_state(name: str) -> None:
    master = STATES[name]()
    restored = _through_first_format(master.state)
    assert restorable(restored) == restorable(master.state)
    cut = len(master.log) // 2
    from_cut = _through_first_format(replay(master.log[:cut]))
    from_cut.apply_all(master.log[cut:])
    assert restorable(from_cut) == restorable(master.state)


def _fixture_log() -> list[LogRecord]:
    data = (FIXTURE / "log.bin").read_bytes()
    records, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from(">I", data, at)
        records.append(checkpoint_codec.record_in(data[at + 4 : at + 4 + size]))
        at += 4 + size
    return records


def test_a_snapshot_the_old_encoder_wrote_still_loads_and_is_rewritten_in_the_new_format() -> None:
    log = _fixture_log()
    expected = replay(log)
    assert len(expected.jobs) == 4  # the whole fixture was read
    assert expected.lifetime_model is not None
    loaded = checkpoint_codec.snapshot_in((FIXTURE / "snapshot.bin").read_bytes(), snapshot_v1.FORMAT)
    assert restorable(loaded) == restorable(expected)
    # The next snapshot a master takes of it is a CellSnapshot, which gives the same state.
    assert restorable(_through_cell_snapshot(loaded)) == restorable(expected)


def test_the_first_format_loses_the_drain_of_a_down_machine_the_cell_snapshot_keeps_it() -> None:
    master: Master = down_while_draining()
    assert (master.state.machines["m0"].state, master.state.machines["m0"].draining) == (
        MachineState.DOWN,
        True,
    )
    returned = MachineRegistered(master.state.machines["m0"].spec)
    master.commit([returned])  # it restarts and registers again: still draining, nothing placed there
    for through, keeps in ((_through_cell_snapshot, True), (_through_first_format, False)):
        restored = through(replay(master.log[:-1]))
        restored.apply_all(master.log[-1:])
        assert restored.machines["m0"].draining is keeps
        assert (restorable(restored) == restorable(master.state)) is keeps


def test_an_unknown_format_is_refused_naming_it() -> None:
    with pytest.raises(
        InvalidField, match=r"snapshot\.format: unknown snapshot format 'cellpilot\.api\.v2\.Snap'"
    ):
        checkpoint_codec.snapshot_in(b"", "cellpilot.api.v2.Snap")


def test_a_task_whose_limits_are_the_spec_s_stores_none_and_reads_the_spec_s() -> None:
    master = STATES["rolling update"]()
    snapshot = checkpoint_codec.snapshot_out(master.state, 1)
    (job,) = snapshot.jobs
    record = master.state.jobs["alice/web"]
    stored = {t.index: t.HasField("limits") for t in job.tasks}
    assert stored == {i: t.limits != record.spec.task.limits for i, t in record.tasks.items()}
    assert set(stored.values()) == {True, False}
    restored = _through_cell_snapshot(master.state)
    assert [t.limits for t in restored.jobs["alice/web"].tasks.values()] == [
        t.limits for t in record.tasks.values()
    ]
    assert TaskState.RUNNING in {t.state for t in record.tasks.values()}
