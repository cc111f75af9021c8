"""Cell states with every kind of record a snapshot must carry, built by the pure core.

Each builder returns a :class:`Master` whose log replays to its state; the snapshot-format
tests round-trip each of them, and the first-format fixture (``fixtures/snapshot_v1``) was
written from :func:`everything`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from borg_builders import Master, job_spec, machine_spec

from cellpilot.borg.decisions import KillJob, SetMachineState, SetQuota, SubmitJob, UpdateJob
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import (
    AutopilotConfig,
    Constraint,
    HorizontalScaling,
    MachineAvailability,
    ProcessRuntime,
    VerticalScaling,
)
from cellpilot.borg.mutations import (
    LavaHost,
    LavaHostsChanged,
    LeaderElected,
    LifetimeModelTrained,
    MachineStateChanged,
    RestartBackoff,
    TaskStateChanged,
)
from cellpilot.job_vocabulary import (
    ConstraintKind,
    ConstraintOperator,
    PriorityBand,
    RecommenderKind,
    ScalingMode,
)
from cellpilot.schedule import Resources
from cellpilot.schedule.lifetime_aware.lava import OPEN, RECYCLING
from cellpilot.units import GIB

AUTOPILOT = AutopilotConfig(
    VerticalScaling(ScalingMode.ON, 100, 4000, RecommenderKind.ML),
    VerticalScaling(ScalingMode.DRY_RUN, recommender=RecommenderKind.CUSTOM, custom_name="mine"),
    HorizontalScaling(
        ScalingMode.ON, 1, 10, target_utilization=0.6, small_change_fraction=0.1, reference_cpu_millicores=500
    ),
)


def _cell(machines: int = 3) -> Master:
    master = Master()
    master.add_machines(
        *(
            machine_spec(f"m{i}", attributes=(("arch", "x86_64"), ("rack", f"r{i % 2}")))
            for i in range(machines)
        )
    )
    master.grant("alice", PriorityBand.PRODUCTION)
    master.grant("alice", PriorityBand.BATCH)
    return master


def empty() -> Master:
    return Master()


def machines_up_draining_down() -> Master:
    master = _cell(4)
    master.accept(SetMachineState("drain", "m1", MachineAvailability.DRAINING, "maintenance"))
    master.commit([MachineStateChanged("m2", MachineAvailability.DOWN, "missed 5 polls")])
    return master


def down_while_draining() -> Master:
    """A draining machine that went down is still draining when it comes back (re-registers)."""
    master = _cell(2)
    master.accept(SubmitJob("s", job_spec("web", task_count=2)))
    master.schedule()
    master.accept(SetMachineState("drain", "m0", MachineAvailability.DRAINING, "maintenance"))
    master.commit([MachineStateChanged("m0", MachineAvailability.DOWN, "missed 5 polls")])
    return master


def held_and_released() -> Master:
    master = _cell()
    master.accept(SubmitJob("h1", job_spec("held", autopilot=AUTOPILOT)))
    master.accept(SubmitJob("h2", job_spec("released", autopilot=AUTOPILOT, ports=2)))
    master.accept(
        UpdateJob("r", "alice/released", master.state.jobs["alice/released"].spec, release_hold=True)
    )
    master.schedule()
    return master


def rolling_update() -> Master:
    master = _cell()
    master.accept(SubmitJob("s", job_spec("web", task_count=3)))
    master.schedule()
    old = master.state.jobs["alice/web"].spec
    # A new binary and bigger limits: the running tasks keep their limits until their turn.
    binary = replace(
        old.task,
        limits=Resources(1500, 2 * GIB, 0, 0),
        runtime=ProcessRuntime("/bin/true", ("-x",), (("A", "1"),)),
    )
    master.accept(UpdateJob("u", "alice/web", replace(old, task=binary), ("task",), max_disruptions=1))
    return master


def backoff_and_avoidance() -> Master:
    master = _cell()
    master.accept(SubmitJob("s", job_spec("crashy", task_count=3, ports=2)))
    master.schedule()
    first = master.state.jobs["alice/crashy"].tasks[0]
    master.commit(
        [
            TaskStateChanged(
                "alice/crashy",
                0,
                first.incarnation,
                TaskState.PENDING,
                TaskEvent.OOM,
                "over its memory limit",
                Resources(5, GIB),
                RestartBackoff(3, 1_005_000, 1_001_000, first.machine_id, 2_000_000),
            )
        ]
    )
    second = master.state.jobs["alice/crashy"].tasks[1]
    master.commit(
        [
            TaskStateChanged(
                "alice/crashy",
                1,
                second.incarnation,
                TaskState.PENDING,
                TaskEvent.FAILED,
                "exit 3",
                None,
                RestartBackoff(1, 1_010_000, 1_002_000, second.machine_id, 0),
            )
        ]
    )
    third = master.state.jobs["alice/crashy"].tasks[2]
    master.commit(
        [
            TaskStateChanged(
                "alice/crashy", 2, third.incarnation, TaskState.DEAD, TaskEvent.FAILED_FOR_GOOD, "gave up"
            )
        ]
    )
    return master


def scaled_down_and_resubmitted() -> Master:
    master = _cell()
    master.accept(SubmitJob("s", job_spec("web", task_count=4)))
    master.schedule()
    spec = master.state.jobs["alice/web"].spec
    master.accept(UpdateJob("down", "alice/web", replace(spec, task_count=2), ("task_count",)))
    master.accept(SubmitJob("b", job_spec("batch", priority=5, task_count=2)))
    master.schedule()
    master.accept(KillJob("k", "alice/batch", payload_digest="digest-of-k"))
    master.accept(SubmitJob("again", job_spec("batch", priority=5, task_count=3)))
    master.schedule()
    return master


def quotas_lowered_below_use() -> Master:
    master = _cell()
    master.grant("bob", PriorityBand.BATCH, cores=4, ram_gib=8)
    master.accept(SubmitJob("s", job_spec("web", task_count=2)))
    master.schedule()
    master.accept(SetQuota("low", "alice", PriorityBand.PRODUCTION, Resources(500, GIB, 0, 0)))
    return master


def lava_hosts_model_and_leader() -> Master:
    master = _cell()
    master.commit([LeaderElected("replica-1", "127.0.0.1:7101", 3)])
    master.accept(SubmitJob("s", job_spec("batchy", task_count=2)))
    master.schedule()
    tasks = master.state.jobs["alice/batchy"].tasks
    master.commit(
        [
            LifetimeModelTrained(
                '{"format": "cellpilot.lifetime-model/1", "trees": "..."}', 120, master.now_ms
            ),
            LavaHostsChanged(
                (
                    LavaHost("m0", OPEN, 2, master.now_ms + 3_600_000, ((tasks[0].job_id, tasks[0].index),)),
                    LavaHost(
                        "m1", RECYCLING, 0, master.now_ms + 60_000, (("alice/batchy", 1), ("alice/old", 0))
                    ),
                )
            ),
        ]
    )
    return master


def everything() -> Master:
    """Every kind of record in one cell: the first-format fixture's state."""
    master = _cell(4)
    master.commit([LeaderElected("replica-0", "127.0.0.1:7100", 1)])
    constraint = Constraint("arch", ConstraintOperator.EQUAL, "x86_64", ConstraintKind.SOFT)
    master.accept(SubmitJob("a", job_spec("auto", autopilot=AUTOPILOT, constraints=(constraint,), ports=2)))
    master.accept(SubmitJob("h", job_spec("held", autopilot=AUTOPILOT)))
    master.accept(SubmitJob("b", job_spec("web", task_count=3)))
    master.accept(SubmitJob("c", job_spec("batch", priority=5, task_count=2)))
    master.schedule()
    new = job_spec("web", task_count=4)
    binary = replace(new.task, runtime=ProcessRuntime("/bin/true", ("-x",), (("A", "1"),)))
    master.accept(UpdateJob("u", "alice/web", replace(new, task=binary), ("task",), max_disruptions=1))
    master.schedule()
    web = master.state.jobs["alice/web"].tasks
    master.commit(
        [
            TaskStateChanged(
                "alice/web",
                0,
                web[0].incarnation,
                TaskState.PENDING,
                TaskEvent.OOM,
                "over",
                Resources(5, GIB),
                RestartBackoff(3, 1_005_000, 1_001_000, web[0].machine_id, 2_000_000),
            ),
            TaskStateChanged(
                "alice/web", 1, web[1].incarnation, TaskState.DEAD, TaskEvent.FAILED_FOR_GOOD, "gave up"
            ),
        ]
    )
    master.accept(UpdateJob("r", "alice/auto", master.state.jobs["alice/auto"].spec, release_hold=True))
    batch = master.state.jobs["alice/batch"].spec
    master.accept(UpdateJob("down", "alice/batch", replace(batch, task_count=1), ("task_count",)))
    master.accept(SetMachineState("d", "m1", MachineAvailability.DRAINING, "maintenance"))
    master.commit([MachineStateChanged("m3", MachineAvailability.DOWN, "missed 5 polls")])
    master.schedule()
    master.accept(SetQuota("q", "alice", PriorityBand.BATCH, Resources(500, GIB, 0, 0)))
    master.commit(
        [
            LifetimeModelTrained('{"format": "cellpilot.lifetime-model/1"}', 40, master.now_ms),
            LavaHostsChanged((LavaHost("m0", OPEN, 1, master.now_ms + 7_200_000, (("alice/auto", 0),)),)),
        ]
    )
    master.accept(KillJob("f", "alice/auto", payload_digest="digest-of-f"))
    return master


STATES: dict[str, Callable[[], Master]] = {
    "empty": empty,
    "machines up, draining, down": machines_up_draining_down,
    "down while draining": down_while_draining,
    "held and released": held_and_released,
    "rolling update": rolling_update,
    "backoff and avoidance": backoff_and_avoidance,
    "scaled down and resubmitted": scaled_down_and_resubmitted,
    "quota lowered below use": quotas_lowered_below_use,
    "lava hosts, model, leader": lava_hosts_model_and_leader,
    "everything": everything,
}
