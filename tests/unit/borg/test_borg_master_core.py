"""The elected master's pure core (Borg §3, §3.4): every stimulus through one entry point, and a
scheduler's proposals judged optimistically against the current state."""

from __future__ import annotations

from typing import Any

import pytest
from borg_builders import job_spec, machine_spec

from cellpilot.borg.decisions import KillJob, RegisterMachine, SetMachineState, SetQuota, SubmitJob, UpdateJob
from cellpilot.borg.lifecycle import TaskState
from cellpilot.borg.master_core import (
    AppliedReports,
    Elected,
    MachineReports,
    MasterCore,
    MasterRules,
    Stimulus,
)
from cellpilot.borg.model import MachineAvailability
from cellpilot.borg.mutations import TaskScheduled, TaskStateChanged
from cellpilot.borg.poll_diff import MachineReport, ReportedTask
from cellpilot.borg.proposals import PlacementProposal, ProposalVerdict, ProposedPlacement
from cellpilot.borg.scheduler_copy import SchedulerCopy
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Resources
from cellpilot.units import GIB

WALL_MS = 1_000_000


class Shell:
    """The service's part, done as the service does it: batch, decide, append (here: a list),
    apply, refresh the soft state, answer."""

    def __init__(self) -> None:
        self.core = MasterCore(SchedulingView(), MasterRules())
        self.core.epoch = 1
        self.log: list[Any] = []
        self.wall_ms = WALL_MS
        self.submit(Elected("bm-0", "127.0.0.1:7100", 1))

    def submit_all(self, *stimuli: Stimulus) -> list[tuple[Any, int]]:
        """One batch, if the core admits them all together (an assertion otherwise)."""
        batch = self.core.batch(self.wall_ms)
        assert all(batch.admits(s) for s in stimuli), "the stimuli do not share a batch"
        outcomes = [batch.decide(s, "test") for s in stimuli]
        first = self.core.state.last_sequence + 1
        records = self.core.records(outcomes, first, self.core.epoch)
        self.log += records
        self.core.apply(records)
        answers, position = [], first
        for outcome in outcomes:
            self.core.after_commit(outcome, self.wall_ms)
            answers.append((outcome.answer, position if outcome.mutations else outcome.position))
            position += len(outcome.mutations)
        self.wall_ms += 1_000
        return answers

    def submit(self, stimulus: Stimulus) -> Any:
        return self.submit_all(stimulus)[0][0]

    def cell(self, machines: int = 2, cpu: float = 4000) -> None:
        for i in range(machines):
            self.submit(RegisterMachine(f"reg-{i}", machine_spec(f"m{i}", cpu=cpu)))
        self.submit(SetQuota("quota", "alice", PriorityBand.PRODUCTION, Resources(1e9, 1e15, 1e15, 1e6)))
        self.submit(SetQuota("quota-b", "alice", PriorityBand.BATCH, Resources(1e9, 1e15, 1e15, 1e6)))

    def placement(self, job_id: str, index: int, machine_id: str, **changes: int) -> ProposedPlacement:
        job = self.core.state.jobs[job_id]
        task = job.tasks[index]
        values = {"incarnation": task.incarnation, "spec_version": job.spec_version, **changes}
        return ProposedPlacement(job_id, index, values["incarnation"], values["spec_version"], machine_id)

    def propose(self, *placements: ProposedPlacement, epoch: int = 1) -> ProposalVerdict:
        verdict = self.submit(
            PlacementProposal("scheduler-0", epoch, self.core.state.last_sequence, placements)
        )
        assert isinstance(verdict, ProposalVerdict)
        return verdict


def test_a_fitting_proposal_is_committed_with_the_masters_own_ports() -> None:
    shell = Shell()
    shell.cell()
    shell.submit(SubmitJob("s", job_spec("web", task_count=1, cpu=1000, ports=2)))
    verdict = shell.propose(shell.placement("alice/web", 0, "m1"))
    assert verdict.accepted == (("alice/web", 0),)
    assert not verdict.refused
    scheduled = [r.mutation for r in shell.log if isinstance(r.mutation, TaskScheduled)]
    assert len(scheduled) == 1
    assert scheduled[0].machine_id == "m1"
    assert scheduled[0].incarnation == 1
    assert scheduled[0].ports == (20000, 20001), "the master allocates the ports"
    task = shell.core.state.jobs["alice/web"].tasks[0]
    assert (task.state, task.machine_id) == (TaskState.RUNNING, "m1")


STALE_CASES = [
    ("a newer incarnation", {"incarnation": 5}, None, "the task is no longer pending"),
    ("an older spec version", {"spec_version": 0}, None, "the job was updated since"),
    ("a machine drained since", {}, "drain", "the machine is down, draining or gone"),
    ("a job killed since", {}, "kill", "the job is gone, held or dead"),
    ("a machine filled since", {}, "fill", "no longer feasible there (resources)"),
]


@pytest.mark.parametrize(
    ("case", "changes", "meanwhile", "reason"), STALE_CASES, ids=[c[0] for c in STALE_CASES]
)
def test_a_stale_placement_is_refused_with_its_reason_and_changes_nothing(
    case: str, changes: dict[str, int], meanwhile: str | None, reason: str
) -> None:
    shell = Shell()
    shell.cell(machines=1, cpu=2000)
    shell.submit(SubmitJob("s", job_spec("web", task_count=1, cpu=1500)))
    placement = shell.placement("alice/web", 0, "m0", **changes)
    if meanwhile == "drain":
        shell.submit(SetMachineState("d", "m0", MachineAvailability.DRAINING))
    elif meanwhile == "kill":
        shell.submit(KillJob("k", "alice/web"))
    elif meanwhile == "fill":  # a production job another scheduler placed first takes the room
        shell.submit(SubmitJob("s2", job_spec("db", task_count=1, cpu=1500)))
        assert shell.propose(shell.placement("alice/db", 0, "m0")).accepted
    before = len(shell.log)
    verdict = shell.propose(placement)
    assert verdict.accepted == ()
    assert [(r.key, r.reason) for r in verdict.refused] == [(("alice/web", 0), reason)]
    assert len(shell.log) == before, "a refused placement appends nothing"
    assert shell.core.view.handle_of(("alice/web", 0)) is None, "nor binds anything"
    assert shell.core.proposals.stale == 1
    assert shell.core.proposals.stale_reasons == {reason: 1}


def test_placements_of_one_proposal_see_the_room_the_earlier_ones_took() -> None:
    shell = Shell()
    shell.cell(machines=1, cpu=2000)
    shell.submit(SubmitJob("s", job_spec("web", task_count=3, cpu=800)))
    verdict = shell.propose(*(shell.placement("alice/web", i, "m0") for i in range(3)))
    assert verdict.accepted == (("alice/web", 0), ("alice/web", 1))
    assert [r.key for r in verdict.refused] == [("alice/web", 2)]


def test_a_proposal_for_another_master_is_refused_whole() -> None:
    shell = Shell()
    shell.cell()
    shell.submit(SubmitJob("s", job_spec("web", task_count=1)))
    verdict = shell.propose(shell.placement("alice/web", 0, "m0"), epoch=7)
    assert verdict.wrong_epoch
    assert verdict.accepted == ()


def test_the_master_chooses_the_victims_of_a_preempting_placement() -> None:
    shell = Shell()
    shell.cell(machines=1, cpu=2000)
    shell.submit(SubmitJob("b", job_spec("batch", priority=5, task_count=1, cpu=1500)))
    assert shell.propose(shell.placement("alice/batch", 0, "m0")).accepted
    shell.submit(SubmitJob("p", job_spec("prod", priority=9, task_count=1, cpu=1500)))
    verdict = shell.propose(shell.placement("alice/prod", 0, "m0"))
    assert verdict.accepted == (("alice/prod", 0),)
    assert verdict.preempted == 1
    preempted = [r.mutation for r in shell.log if isinstance(r.mutation, TaskStateChanged)]
    assert [(m.job_id, m.state) for m in preempted] == [("alice/batch", TaskState.PENDING)]


def test_client_commands_share_a_batch_and_reports_and_proposals_go_alone() -> None:
    shell = Shell()
    batch = shell.core.batch(WALL_MS)
    assert batch.admits(SubmitJob("a", job_spec("a")))
    assert batch.admits(SubmitJob("b", job_spec("b")))
    assert not batch.admits(MachineReports((), None, "poll"))
    assert not batch.admits(SubmitJob("a", job_spec("a"))), "the same request id waits for the next batch"
    alone = shell.core.batch(WALL_MS)
    assert alone.admits(MachineReports((), None, "poll"))
    assert not alone.admits(SubmitJob("c", job_spec("c")))
    assert not alone.admits(PlacementProposal("s", 1, 0, ()))


def test_reports_refresh_the_soft_state_and_the_cells_event_time_after_the_commit() -> None:
    shell = Shell()
    shell.cell(machines=1)
    shell.submit(SubmitJob("s", job_spec("web", task_count=1, cpu=1000)))
    shell.propose(shell.placement("alice/web", 0, "m0"))
    event_ms = WALL_MS + 3_600_000  # a simulated fleet an hour ahead of the wall clock
    usage = Resources(200, 0.25 * GIB, 0, 0)
    report = MachineReport(
        "m0", event_ms, 0, (ReportedTask("alice/web", 0, 1, TaskState.RUNNING, usage=usage, ready=True),)
    )
    applied = shell.submit(MachineReports((report,), None, "poll"))
    assert isinstance(applied, AppliedReports)
    assert applied.applied == frozenset({"m0"})
    soft = shell.core.soft
    assert soft.task_usage[("alice/web", 0)] == usage
    assert soft.task_ready[("alice/web", 0)]
    assert soft.latest_event_ms == event_ms
    assert shell.core.event_now_ms(WALL_MS) == event_ms, "the cell's clock is the fleet's, not the wall's"


def test_reservations_decay_by_the_cells_event_time_and_reach_a_scheduler_alike() -> None:
    """Borg §5.5: a reservation starts at the limit and decays toward usage plus a margin. A fleet
    in event time (hours per wall minute) reclaims at its own pace; the scheduler's copy takes the
    master's numbers through the soft feed, so both judge a non-prod placement alike."""
    shell = Shell()
    shell.cell(machines=1, cpu=4000)
    shell.submit(SubmitJob("s", job_spec("web", priority=9, task_count=1, cpu=3000)))
    shell.propose(shell.placement("alice/web", 0, "m0"))
    usage = Resources(300, 0.25 * GIB, 0, 0)
    for hour in range(1, 4):  # three reports, an event-hour apart, seconds apart on the wall
        task = ReportedTask("alice/web", 0, 1, TaskState.RUNNING, usage=usage, ready=True)
        shell.submit(
            MachineReports((MachineReport("m0", WALL_MS + hour * 3_600_000, 0, (task,)),), None, "poll")
        )
    reserved = shell.core.view.reservation("alice/web", 0)
    assert reserved is not None
    assert reserved.cpu < 1000, f"the reservation decayed toward usage in event time ({reserved.cpu} m)"
    scheduler = SchedulerCopy("scheduler-0", SchedulingView())
    scheduler.apply(shell.log)
    entries = shell.core.view.soft_changes(scheduler.feed_since(1))
    scheduler.take_soft(1, shell.core.view.feed.version, shell.core.event_now_ms(WALL_MS), entries)
    taken = scheduler.view.reservation("alice/web", 0)
    assert taken is not None
    assert taken.array() == pytest.approx(reserved.array())
    # Non-prod work lands in what was reclaimed: 2 cores of batch fit beside 3 cores of limits.
    shell.submit(SubmitJob("b", job_spec("batch", priority=5, task_count=1, cpu=2000)))
    scheduler.apply(shell.log[len(scheduler.state.jobs) and scheduler.state.last_sequence :])
    proposal, _ = scheduler.plan(WALL_MS, 1, 100)
    assert proposal is not None
    assert [p.machine_id for p in proposal.placements] == ["m0"]
    assert shell.propose(*proposal.placements).accepted == (("alice/batch", 0),)


def test_a_second_scheduler_on_a_stale_copy_is_refused_and_reconciles() -> None:
    shell = Shell()
    shell.cell(machines=1, cpu=2000)
    shell.submit(SubmitJob("s", job_spec("web", task_count=2, cpu=1000)))
    first, second = SchedulerCopy("a", SchedulingView()), SchedulerCopy("b", SchedulingView())
    for copy in (first, second):
        copy.apply(shell.log)
    proposal_a, _ = first.plan(WALL_MS, 1, 100)
    proposal_b, plan_b = second.plan(WALL_MS, 1, 100)
    assert proposal_a is not None
    assert proposal_b is not None
    assert len(shell.propose(*proposal_a.placements).accepted) == 2
    verdict = shell.propose(*proposal_b.placements)
    assert verdict.accepted == ()
    assert {r.reason for r in verdict.refused} == {"the task is no longer pending"}
    second.apply(shell.log[second.state.last_sequence :])
    second.reconcile(plan_b)
    for index in range(2):
        handle = second.view.handle_of(("alice/web", index))
        assert handle is not None, "the copy binds the tasks where the log says they run"
    assert second.view.tasks_running() == 2, "and nothing it proposed stays bound twice"


def test_a_pass_planned_while_a_proposal_is_in_flight_leaves_its_tasks_out() -> None:
    """Pipelined passes (Borg §3.4): the next pass is planned before the master answered the
    last proposal; it places the other pending tasks, never the ones in flight, and both
    proposals are accepted whole."""
    shell = Shell()
    shell.cell(machines=2, cpu=4000)
    shell.submit(SubmitJob("s", job_spec("web", task_count=4, cpu=1000)))
    copy = SchedulerCopy("a", SchedulingView())
    copy.apply(shell.log)
    first, first_plan = copy.plan(WALL_MS, 1, 2)
    assert first is not None
    in_flight = SchedulerCopy.placed_by(first_plan)
    assert len(in_flight) == 2
    second, second_plan = copy.plan(WALL_MS, 1, 2, in_flight=set(in_flight))
    assert second is not None
    assert not set(SchedulerCopy.placed_by(second_plan)) & set(in_flight)
    assert len(shell.propose(*first.placements).accepted) == 2
    assert len(shell.propose(*second.placements).accepted) == 2
    copy.apply(shell.log[copy.state.last_sequence :])
    copy.reconcile(first_plan)
    copy.reconcile(second_plan)
    assert copy.view.tasks_running() == 4
    assert not copy.state.pending


def test_a_pass_never_sent_is_reconciled_away() -> None:
    """A plan whose proposal never reached a master (it stepped down meanwhile) gives its room
    back: once reconciled, the next pass places the same tasks again."""
    shell = Shell()
    shell.cell(machines=1, cpu=2000)
    shell.submit(SubmitJob("s", job_spec("web", task_count=2, cpu=1000)))
    copy = SchedulerCopy("a", SchedulingView())
    copy.apply(shell.log)
    _, lost_plan = copy.plan(WALL_MS, 1, 100)
    assert len(SchedulerCopy.placed_by(lost_plan)) == 2
    copy.reconcile(lost_plan)
    assert copy.view.tasks_running() == 0
    again, _ = copy.plan(WALL_MS, 1, 100)
    assert again is not None
    assert len(shell.propose(*again.placements).accepted) == 2


def test_an_update_through_the_batch_still_sees_the_masters_view() -> None:
    shell = Shell()
    shell.cell(machines=1, cpu=4000)
    shell.submit(SubmitJob("s", job_spec("web", task_count=1, cpu=1000)))
    shell.propose(shell.placement("alice/web", 0, "m0"))
    result = shell.submit(
        UpdateJob("u", "alice/web", job_spec("web", task_count=1, cpu=2000), ("task.limits.cpu_millicores",))
    )
    assert result is not None
    task = shell.core.state.jobs["alice/web"].tasks[0]
    assert task.state is TaskState.RUNNING, "a resize that fits is applied in place"
    assert task.limits.cpu == 2000
