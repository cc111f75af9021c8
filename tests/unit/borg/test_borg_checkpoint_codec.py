"""The checkpoint's storage encoding round-trips: records and snapshots decode to what was encoded."""

from __future__ import annotations

from pathlib import Path

from borg_builders import Master, job_spec, machine_spec, replay

from cellpilot.borg.decisions import KillJob, SetMachineState, SubmitJob, UpdateJob
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import (
    AutopilotConfig,
    Constraint,
    HorizontalScaling,
    MachineAvailability,
    ProcessRuntime,
    VerticalScaling,
)
from cellpilot.borg.mutations import MachineStateChanged, RestartBackoff, TaskStateChanged
from cellpilot.borg_wire import checkpoint as checkpoint_codec
from cellpilot.borg_wire import statuses
from cellpilot.job_vocabulary import (
    ConstraintKind,
    ConstraintOperator,
    PriorityBand,
    RecommenderKind,
    ScalingMode,
)
from cellpilot.schedule import Resources
from cellpilot.units import GIB


def _eventful_master() -> Master:
    master = Master()
    master.add_machines(machine_spec("m0", attributes=(("arch", "x86_64"),)), machine_spec("m1"))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.grant("alice", PriorityBand.BATCH)
    autopilot = AutopilotConfig(
        VerticalScaling(ScalingMode.ON, 100, 4000, RecommenderKind.ML),
        VerticalScaling(ScalingMode.DRY_RUN, recommender=RecommenderKind.CUSTOM, custom_name="mine"),
        HorizontalScaling(
            ScalingMode.ON,
            1,
            10,
            target_utilization=0.6,
            small_change_fraction=0.1,
            reference_cpu_millicores=500,
        ),
    )
    constraint = Constraint("arch", ConstraintOperator.EQUAL, "x86_64", ConstraintKind.SOFT)
    master.accept(SubmitJob("a", job_spec("auto", autopilot=autopilot, constraints=(constraint,), ports=2)))
    spec = job_spec("web", task_count=3)
    master.accept(SubmitJob("b", spec))
    master.schedule()
    running = master.state.jobs["alice/web"].tasks[0]
    master.commit(
        [
            TaskStateChanged(
                "alice/web",
                0,
                running.incarnation,
                TaskState.PENDING,
                TaskEvent.OOM,
                "over",
                Resources(5, GIB),
                RestartBackoff(3, 1_005_000, 1_001_000, running.machine_id, 2_000_000),
            )
        ]
    )
    master.commit([TaskStateChanged("alice/web", 1, 1, TaskState.DEAD, TaskEvent.FAILED_FOR_GOOD, "gave up")])
    new = job_spec("web", task_count=4)
    binary = new.task.__class__(new.task.limits, runtime=ProcessRuntime("/bin/true", ("-x",), (("A", "1"),)))
    master.accept(
        UpdateJob(
            "c", "alice/web", new.__class__(**{**vars(new), "task": binary}), ("task",), max_disruptions=1
        )
    )
    master.accept(UpdateJob("d", "alice/auto", master.state.jobs["alice/auto"].spec, release_hold=True))
    master.accept(SetMachineState("e", "m1", MachineAvailability.DRAINING, "maintenance"))
    master.commit([MachineStateChanged("m0", MachineAvailability.DOWN, "missed 5 polls")])
    master.schedule()
    master.accept(KillJob("f", "alice/auto", payload_digest="digest-of-f"))
    return master


def test_every_record_decodes_to_what_was_encoded() -> None:
    master = _eventful_master()
    kinds = set()
    for record in master.log:
        data = checkpoint_codec.record_out(record).SerializeToString()
        assert checkpoint_codec.record_in(data) == record
        kinds.add(type(record.mutation).__name__)
    assert {"JobSubmitted", "JobUpdated", "JobKilled", "TaskScheduled", "TaskStateChanged"} <= kinds
    assert {"MachineRegistered", "MachineStateChanged", "QuotaSet"} <= kinds


def test_a_snapshot_decodes_to_the_same_state_and_the_log_continues_from_it() -> None:
    master = _eventful_master()
    cut = len(master.log) // 2
    at_cut = replay(master.log[:cut])
    data = checkpoint_codec.snapshot_out(at_cut, epoch=1).SerializeToString()
    restored = checkpoint_codec.snapshot_in(data)
    assert restored.describe() == at_cut.describe()
    restored.apply_all(master.log[cut:])
    assert restored.describe() == master.state.describe()
    whole = checkpoint_codec.snapshot_in(checkpoint_codec.snapshot_out(master.state, 1).SerializeToString())
    kill = whole.applied_requests["f"]
    assert (kill.method, kill.digest, kill.job_id) == ("KillJob", "digest-of-f", "alice/auto")


def test_events_carry_the_log_position_and_cause() -> None:
    master = _eventful_master()
    changes = master.commit([MachineStateChanged("m1", MachineAvailability.UP, "drained")])
    (event,) = [statuses.change_out(c) for c in changes]
    assert event.WhichOneof("event") == "machine"
    assert event.machine.log_sequence == master.state.last_sequence
    assert event.machine.cause_id == "test"


RECORDS_FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_records_v1"


def _length_prefixed(chunks: list[bytes]) -> bytes:
    return b"".join(len(chunk).to_bytes(4, "big") + chunk for chunk in chunks)


def test_the_log_of_the_eventful_cell_is_byte_identical_to_the_stored_fixture() -> None:
    """The fixture holds this cell's log as the encoder wrote it before the model renames (the
    scheduler's PlacementJob/PlacementTask/CellMachine, the recommender's RecommenderState):
    renaming types changes no stored byte, and the stored records still decode to the same log."""
    master = _eventful_master()
    encoded = [checkpoint_codec.record_out(record).SerializeToString() for record in master.log]
    stored = RECORDS_FIXTURE.read_bytes()
    assert _length_prefixed(encoded) == stored
    offset, decoded = 0, []
    while offset < len(stored):
        size = int.from_bytes(stored[offset : offset + 4], "big")
        decoded.append(checkpoint_codec.record_in(stored[offset + 4 : offset + 4 + size]))
        offset += 4 + size
    assert decoded == master.log
