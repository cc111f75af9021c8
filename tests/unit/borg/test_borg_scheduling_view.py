"""The scheduling view: priority order, preemption through the log, ports, constraints, why pending."""

from __future__ import annotations

import pytest
from borg_builders import Master, job_spec, machine_spec

from cellpilot.borg.decisions import SubmitJob
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import Constraint
from cellpilot.borg.mutations import TaskScheduled, TaskStateChanged
from cellpilot.borg.pending_reasons import explain
from cellpilot.borg.scheduling_view import allocate_ports
from cellpilot.job_vocabulary import ConstraintKind, ConstraintOperator, PriorityBand
from cellpilot.units import GIB

ATTRS = {
    "a": (("arch", "x86_64"), ("ssd", "true"), ("gen", "3")),
    "b": (("arch", "arm64"), ("gen", "5")),
    "c": (("arch", "x86_64"), ("gen", "7")),
}


def _eligible(constraint: Constraint) -> set[str]:
    """A brute-force reading of the API operators over ATTRS."""
    out = set()
    for name, attrs in ATTRS.items():
        values = dict(attrs)
        have = constraint.attribute in values
        value = values.get(constraint.attribute)
        op = constraint.operator
        if op is ConstraintOperator.EQUAL:
            ok = have and value == constraint.value
        elif op is ConstraintOperator.NOT_EQUAL:
            ok = value != constraint.value
        elif op is ConstraintOperator.LESS_THAN:
            ok = have and float(str(value)) < float(constraint.value)
        elif op is ConstraintOperator.GREATER_THAN:
            ok = have and float(str(value)) > float(constraint.value)
        else:
            ok = have == (op is ConstraintOperator.EXISTS)
        if ok:
            out.add(name)
    return out


CONSTRAINTS = [
    Constraint("arch", ConstraintOperator.EQUAL, "x86_64"),
    Constraint("arch", ConstraintOperator.NOT_EQUAL, "x86_64"),
    Constraint("gen", ConstraintOperator.LESS_THAN, "6"),
    Constraint("gen", ConstraintOperator.GREATER_THAN, "4"),
    Constraint("ssd", ConstraintOperator.EXISTS),
    Constraint("ssd", ConstraintOperator.NOT_EXISTS),
]


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda c: f"{c.attribute}-{c.operator.value}")
def test_hard_constraints_restrict_machines_as_the_api_defines(constraint: Constraint) -> None:
    master = Master()
    master.add_machines(*(machine_spec(name, attributes=attrs) for name, attrs in ATTRS.items()))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.accept(SubmitJob("s", job_spec(task_count=6, cpu=100, constraints=(constraint,))))
    master.schedule()
    used = {t.machine_id for t in master.state.jobs["alice/web"].tasks.values() if t.machine_id}
    expected = _eligible(constraint)
    assert used <= expected
    assert used == expected, "six small tasks spread over every eligible machine"


def test_pending_tasks_are_placed_high_priority_first_and_preemption_goes_through_the_log() -> None:
    master = Master()
    master.add_machines(machine_spec("m0", cpu=4000, ram_gib=8))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.grant("bob", PriorityBand.BATCH)
    master.accept(SubmitJob("b", job_spec("batch", user="bob", priority=3, task_count=4, cpu=1000)))
    master.schedule()
    batch = master.state.jobs["bob/batch"]
    assert all(t.state is TaskState.RUNNING for t in batch.tasks.values())
    master.accept(SubmitJob("p", job_spec("web", priority=9, task_count=2, cpu=1500)))
    plan = master.schedule()
    preemptions = [m for m in plan.mutations if isinstance(m, TaskStateChanged)]
    scheduled = [m for m in plan.mutations if isinstance(m, TaskScheduled)]
    assert len(scheduled) == 2
    assert all(m.reason is TaskEvent.PREEMPTED for m in preemptions)
    assert len(preemptions) == 3, "3 GiB of batch CPU must go to fit 3 cores of prod"
    first_scheduled = plan.mutations.index(scheduled[0])
    assert all(plan.mutations.index(p) < first_scheduled for p in preemptions[:1]), "victims logged first"
    assert sum(t.state is TaskState.PENDING for t in batch.tasks.values()) == 3
    assert all(t.reason is TaskEvent.PREEMPTED for t in batch.tasks.values() if t.state is TaskState.PENDING)
    assert master.schedule().placed == 0, "victims stay pending: there is no room"


def test_a_pass_takes_users_round_robin_within_a_priority() -> None:
    # Room for four 1-core tasks. Alice submitted first and has four; without round-robin
    # she would take the whole machine (Borg §3.2: round-robin across users in a priority).
    master = Master()
    master.add_machines(machine_spec("m0", cpu=4000, ram_gib=64))
    for user in ("alice", "bob", "carol", "dave"):
        master.grant(user, PriorityBand.PRODUCTION)
    master.accept(SubmitJob("a", job_spec("a", user="alice", priority=9, task_count=4, cpu=1000)))
    master.accept(SubmitJob("b", job_spec("b", user="bob", priority=9, task_count=4, cpu=1000)))
    master.accept(SubmitJob("c", job_spec("c", user="carol", priority=9, task_count=1, cpu=1000)))
    master.accept(SubmitJob("d", job_spec("d", user="dave", priority=10, task_count=1, cpu=1000)))
    plan = master.schedule()
    placed = sorted(f"{m.job_id}/{m.task_index}" for m in plan.mutations if isinstance(m, TaskScheduled))
    assert placed == ["alice/a/0", "bob/b/0", "carol/c/0", "dave/d/0"], "higher priority first, then one each"
    next_pass = master.schedule()
    assert next_pass.placed == 0, "full: the rest stays pending"


def test_prod_never_preempts_prod() -> None:
    master = Master()
    master.add_machines(machine_spec("m0", cpu=2000))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.accept(SubmitJob("a", job_spec("low", priority=9, task_count=2, cpu=1000)))
    master.schedule()
    master.accept(SubmitJob("b", job_spec("high", priority=10, task_count=1, cpu=1000)))
    plan = master.schedule()
    assert plan.mutations == ()
    report = explain(master.view, master.state, "alice/high", 0)
    assert report.machines_total == 1
    assert report.machines_feasible == 0
    cpu = next(s for s in report.resource_exclusions if s.resource == "cpu")
    assert cpu.machines_excluded == 1
    assert cpu.max_available == 0
    assert "cpu" in report.summary


def test_why_pending_names_the_constraint_and_the_fitting_limits() -> None:
    master = Master()
    master.add_machines(
        machine_spec("m0", ram_gib=8), machine_spec("m1", ram_gib=4, attributes=(("ssd", "1"),))
    )
    master.grant("alice", PriorityBand.PRODUCTION, ram_gib=100)
    ssd = Constraint("ssd", ConstraintOperator.EXISTS, kind=ConstraintKind.HARD)
    master.accept(SubmitJob("s", job_spec(task_count=1, ram_gib=6, constraints=(ssd,))))
    assert master.schedule().placed == 0
    report = explain(master.view, master.state, "alice/web", 0)
    assert report.constraint_exclusions == ((ssd, 1),)
    ram = next(s for s in report.resource_exclusions if s.resource == "ram")
    assert ram.machines_excluded == 1, "only the 4 GiB machine lacks RAM"
    assert ram.max_available == 4 * GIB, "the ssd machine has 4 GiB"
    assert report.fitting_limits is not None
    assert report.fitting_limits.ram <= 4 * GIB + 1
    assert report.fitting_limits.cpu == 1000


@pytest.mark.parametrize(
    ("taken", "count", "expected"),
    [(set(), 2, (20000, 20001)), ({20000, 20002}, 2, (20001, 20003)), (set(range(20000, 20009)), 2, None)],
    ids=["lowest-free", "skips-taken", "exhausted"],
)
def test_ports_are_handed_out_from_the_machine_range(
    taken: set[int], count: int, expected: tuple[int, ...] | None
) -> None:
    assert allocate_ports(machine_spec(ports=10), taken, count) == expected


def test_scheduled_tasks_get_distinct_ports_on_a_machine() -> None:
    master = Master()
    master.add_machines(machine_spec("m0", ports=6))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.accept(SubmitJob("s", job_spec(task_count=3, cpu=100, ports=2)))
    master.schedule()
    ports = [p for t in master.state.jobs["alice/web"].tasks.values() for p in t.ports]
    assert sorted(ports) == list(range(20000, 20006))


def _gpa_master(rho: float) -> Master:
    from cellpilot.borg.scheduling_view import SchedulingView
    from cellpilot.schedule import default_profile
    from cellpilot.schedule.cpu_demand import CpuLearning

    master = Master(
        view=SchedulingView(default_profile("best-fit", rho), cpu_learning=CpuLearning(min_samples=5))
    )
    master.add_machines(machine_spec("m0", cpu=8000, ram_gib=64), machine_spec("m1", cpu=8000, ram_gib=64))
    master.grant("bob", PriorityBand.BATCH)
    master.accept(SubmitJob("b", job_spec("batch", user="bob", priority=3, task_count=80, cpu=1000)))
    return master


def _running(master: Master) -> list[tuple[str, int]]:
    job = master.state.jobs["bob/batch"]
    return [("bob/batch", t.index) for t in job.tasks.values() if t.state is TaskState.RUNNING]


def _poll(master: Master, rng: object, cycles: int) -> None:
    import numpy as np

    assert isinstance(rng, np.random.Generator)
    for _ in range(cycles):
        by_machine: dict[str, dict[tuple[str, int], float]] = {}
        for key in _running(master):
            machine = master.state.jobs[key[0]].tasks[key[1]].machine_id
            by_machine.setdefault(machine, {})[key] = max(float(rng.normal(250.0, 60.0)), 0.0)
        master.view.observe_cpu((tasks, 8000.0) for tasks in by_machine.values())


@pytest.mark.parametrize("rho", [0.0, 0.05])
def test_gpa_places_non_prod_tasks_by_learned_cpu_moments_and_limits_without_it(rho: float) -> None:
    import numpy as np

    rng = np.random.default_rng(5)
    master = _gpa_master(rho)
    master.schedule()
    assert len(_running(master)) == 16, "by limits: 8 one-core tasks per 8-core machine"
    _poll(master, rng, 30)
    assert len(master.view.cpu_stats()) == 16
    for _ in range(4):
        master.schedule()
        _poll(master, rng, 10)
    placed = len(_running(master))
    if rho == 0.0:
        assert placed == 16
        return
    # mean 250 m, std 60 m: n tasks fit while 250 n + 1.645 * 60 * sqrt(n) <= 8000, i.e. 29 per machine.
    assert 50 <= placed <= 60, placed
    status = master.view.cpu_overflow.counts()
    assert status.machine_samples > 0
    assert status.recent_rate <= 0.2
    master.view.forget_cpu()  # a master stepping down: soft state gone
    assert master.view.cpu_stats() == {}
    assert master.view.cpu_overflow.counts().machine_samples == 0


def test_a_task_that_stops_running_forgets_its_cpu_moments_and_unbound_tasks_learn_nothing() -> None:
    import numpy as np

    from cellpilot.borg.decisions import KillJob

    rng = np.random.default_rng(5)
    master = _gpa_master(0.0)
    master.schedule()
    _poll(master, rng, 10)
    # A sample of a task the view does not run (a stale report) teaches nothing.
    master.view.observe_cpu([({("nobody/ghost", 0): 100.0}, 8000.0)] * 10)
    assert ("nobody/ghost", 0) not in master.view.cpu_moments.tasks()
    learned = len(master.view.cpu_moments.tasks())
    master.accept(KillJob("k", "bob/batch"))
    assert not [key for key in master.view.cpu_moments.tasks() if key[0] == "bob/batch"], (
        "a killed job's tasks are forgotten as they stop, without a sweep"
    )
    assert learned > 0
