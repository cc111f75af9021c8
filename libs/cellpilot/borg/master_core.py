"""The elected Borgmaster's pure core: every stimulus goes through one entry point (Borg §3).

Whatever reaches the master — a client command, Borglet reports (its own polls or a link shard's
differences, §3.3), a scheduler's proposal (§3.4), its own election, a timer, a trained lifetime
model — is a *stimulus*. :meth:`MasterBatch.decide` turns it into an :class:`Outcome`: the
mutations to append to the checkpoint log, the answer for whoever sent it, and the soft-state
refresh that follows once those mutations are committed. The service around it only appends
(fenced by its epoch, several outcomes to one transaction) and then calls :meth:`MasterCore.apply`
and :meth:`MasterCore.after_commit`; nothing else writes the log, and nothing here does I/O.

Outcomes of one batch are decided as if one after another against the committed state: client
commands go through :class:`cellpilot.borg.batch_decisions.BatchDecider` (quota carried through,
overlapping commands left for the next batch); every other stimulus is a batch of its own.

The cell's clock is one: the newest event time a Borglet reported, or the wall clock if that is
later (:meth:`MasterCore.event_now_ms`). Restart backoffs, reclamation (Borg §5.5) and lifetimes
are judged by it, and every record is stamped with it, so a simulated fleet that runs faster than
the wall clock sees reservations decay at its own pace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cellpilot.borg.batch_decisions import BatchDecider
from cellpilot.borg.cell_copy import CellCopy
from cellpilot.borg.changes import Change
from cellpilot.borg.decisions import Accepted, ClientCommand, Command, drain_step, rollout_step
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.mutations import (
    LeaderElected,
    LifetimeModelTrained,
    LogRecord,
    Mutation,
    TaskScheduled,
    to_records,
)
from cellpilot.borg.poll_diff import (
    DEFAULT_MAX_FAILURES,
    DEFAULT_RESTART_POLICY,
    MachineReport,
    PollDiff,
    diff_report,
    machines_down,
)
from cellpilot.borg.proposals import PlacementProposal, ProposalVerdict, Refusal
from cellpilot.borg.restart_backoff import RestartPolicy
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.borg.soft_state import SoftState
from cellpilot.borg.task_lifetimes import lars_order
from cellpilot.schedule import Resources


# ---------------------------------------------------------------------- stimuli
@dataclass(frozen=True)
class MachineReports:
    """Borglet reports to diff against the state (Borg §3.3), and the machines judged for missed
    polls (failed polls in a row per machine; None: none judged, as for an urgent poll)."""

    reports: tuple[MachineReport, ...]
    missed: Mapping[str, int] | None
    cause_id: str


@dataclass(frozen=True)
class Elected:
    """This replica won the lease: the first record it appends names it the log's writer."""

    replica_id: str
    address: str
    epoch: int


@dataclass(frozen=True)
class Tick:
    """Time passed: continue rolling updates and drains (Borg §2.3; LARS order, LAVA §4.4)."""

    cause_id: str


@dataclass(frozen=True)
class ModelTrained:
    """A lifetime model trained on the log's finished runs (LAVA §3), to record in the log."""

    record: LifetimeModelTrained
    cause_id: str


Stimulus = Command | MachineReports | PlacementProposal | Elected | Tick | ModelTrained


# ---------------------------------------------------------------------- outcomes
@dataclass(frozen=True)
class AppliedReports:
    mutations: int = 0
    duplicates: int = 0
    # Machines running duplicates: their next poll carries the desired set again.
    resend: frozenset[str] = frozenset()
    # Machines whose report was diffed.
    applied: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Outcome:
    """What one stimulus comes to: the mutations to append and the answer for its sender.

    ``position`` is the log position to answer with when there are no mutations (a refusal: 0;
    a retried request: where it was applied; a no-op: the head). ``refresh`` holds the reports
    whose soft state is taken in once the mutations are committed.
    """

    mutations: tuple[Mutation, ...]
    answer: Any
    cause_id: str
    command: ClientCommand | None = None
    event_time_ms: int = 0
    position: int = 0
    refresh: tuple[tuple[MachineReport, PollDiff], ...] = ()


@dataclass(frozen=True)
class MasterRules:
    """The master's settings that its decisions depend on."""

    max_task_failures: int = DEFAULT_MAX_FAILURES
    restart_policy: RestartPolicy = DEFAULT_RESTART_POLICY
    missed_polls_down: int = 3
    drain_evictions_per_pass: int = 5
    keeps_lava_host_states: bool = False


@dataclass
class ProposalCounts:
    """Placements proposed by schedulers, as the master judged them (Borg §3.4)."""

    proposals: int = 0
    accepted: int = 0
    stale: int = 0
    preempted: int = 0
    stale_reasons: dict[str, int] = field(default_factory=dict)


class MasterCore(CellCopy):
    """The master's state (logical, soft and its scheduling view) and its one entry point."""

    def __init__(
        self,
        view: SchedulingView,
        rules: MasterRules,
        lifetimes: LifetimeTracker | None = None,
        recent_changes: int = 0,
        recent_task_events: int = 0,
    ) -> None:
        super().__init__(view, recent_changes, recent_task_events)
        self.rules = rules
        self.soft = SoftState()
        self.lifetimes = lifetimes or LifetimeTracker()
        self.proposals = ProposalCounts()
        self.epoch = 0  # the epoch this master appends with (0: not leading)

    # ------------------------------------------------------------------ the clock
    def event_now_ms(self, wall_ms: int) -> int:
        """The cell's event time: the newest a Borglet reported, or the wall clock if later."""
        return max(wall_ms, self.soft.latest_event_ms)

    # ------------------------------------------------------------------ deciding
    def batch(self, wall_ms: int) -> MasterBatch:
        return MasterBatch(self, self.event_now_ms(wall_ms))

    def records(self, outcomes: list[Outcome], first_seq: int, epoch: int) -> list[LogRecord]:
        """The log records of ``outcomes`` at dense positions from ``first_seq``."""
        records: list[LogRecord] = []
        for outcome in outcomes:
            if not outcome.mutations:
                continue
            command = outcome.command
            records += to_records(
                first_seq + len(records),
                epoch,
                outcome.event_time_ms,
                outcome.mutations,
                command.request_id if command else "",
                outcome.cause_id,
                request_method=command.method if command else "",
                request_digest=command.payload_digest if command else "",
            )
        return records

    def after_commit(self, outcome: Outcome, wall_ms: int) -> None:
        """The soft state a committed outcome brings: the reports' usage, readiness, CPU samples
        (GPA §4), last contact and the cell's event time; reservations follow usage (§5.5)."""
        if not outcome.refresh:
            return
        soft, state = self.soft, self.state
        usage: dict[tuple[str, int], Resources] = {}
        cpu_samples = []
        for report, diff in outcome.refresh:
            machine_id = report.machine_id
            machine = state.machines.get(machine_id)
            if machine is not None and soft.is_fresh_second(machine_id, report.event_time_ms):
                cpu_samples.append((diff.cpu_demand, machine.spec.capacity.cpu))
            soft.last_contact_ms[machine_id] = report.event_time_ms
            soft.latest_event_ms = max(soft.latest_event_ms, report.event_time_ms)
            if report.usage is not None:
                soft.machine_usage[machine_id] = report.usage
            soft.cached_packages[machine_id] = report.cached_packages
            soft.task_usage.update(diff.usage)
            soft.task_ready.update(diff.ready)
            usage.update(diff.usage)
        self.view.update_usage(usage, self.event_now_ms(wall_ms))
        self.view.observe_cpu(cpu_samples)

    def step_down(self) -> None:
        """Leaves leading: speculative bindings go, and the soft state (a new master re-learns
        it from its polls; Borg §3.3)."""
        self.discard_speculation()
        self.view.forget_cpu()
        self.soft = SoftState()

    # ------------------------------------------------------------------ lifetimes
    def lifetimes_synced(self, wall_ms: int) -> LifetimeTracker:
        """The lifetime tracker in step with the state and the view's cell (LAVA §3-4)."""
        if self.view.stale:
            self.view.rebuild(self.state)
        self.lifetimes.sync(self.state, self.view.cell, self.event_now_ms(wall_ms) / 1000.0)
        return self.lifetimes


class MasterBatch:
    """One group-commit batch: stimuli decided against the committed state, in order."""

    def __init__(self, core: MasterCore, event_now_ms: int) -> None:
        self.core = core
        self.event_now_ms = event_now_ms
        self.commands = BatchDecider(core.state, event_now_ms, core.view)
        self.kind = ""  # "" (empty), "commands", or "alone" (a stimulus that is a batch of its own)

    def admits(self, stimulus: Stimulus) -> bool:
        """Whether ``stimulus`` may join this batch (see the module docstring)."""
        if isinstance(stimulus, ClientCommand):
            if self.kind not in ("", "commands"):
                return False
            self.kind = "commands"
            return self.commands.admits(stimulus)
        if self.kind:
            return False
        self.kind = "alone"
        return True

    def decide(self, stimulus: Stimulus, cause_id: str = "") -> Outcome:
        """The outcome of one admitted stimulus (``cause_id``: a client command's)."""
        now = self.event_now_ms
        if isinstance(stimulus, ClientCommand):
            return self._command(stimulus, cause_id)
        if isinstance(stimulus, MachineReports):
            return self._reports(stimulus)
        if isinstance(stimulus, PlacementProposal):
            return self._proposal(stimulus)
        if isinstance(stimulus, Elected):
            leader = LeaderElected(stimulus.replica_id, stimulus.address, stimulus.epoch)
            return Outcome((leader,), None, f"election-{stimulus.epoch}", event_time_ms=now)
        if isinstance(stimulus, Tick):
            return Outcome(tuple(self._tick()), None, stimulus.cause_id, event_time_ms=now)
        if isinstance(stimulus, ModelTrained):
            return Outcome((stimulus.record,), None, stimulus.cause_id, event_time_ms=now)
        raise TypeError(f"not a stimulus: {stimulus!r}")

    # ------------------------------------------------------------------ client commands
    def _command(self, command: Command, cause_id: str) -> Outcome:
        state = self.core.state
        result = self.commands.decide(command)
        at = self.event_now_ms
        if not isinstance(result, Accepted):
            return Outcome((), result, cause_id, command, at, position=0)
        if result.already_applied is not None:
            return Outcome((), result, cause_id, command, at, position=result.already_applied.sequence)
        return Outcome(result.mutations, result, cause_id, command, at, position=state.last_sequence)

    # ------------------------------------------------------------------ Borglet reports
    def _reports(self, stimulus: MachineReports) -> Outcome:
        core = self.core
        rules = core.rules
        mutations: list[Mutation] = []
        refresh = []
        duplicates = 0
        resend: set[str] = set()
        for report in stimulus.reports:
            diff = diff_report(core.state, report, rules.max_task_failures, rules.restart_policy)
            refresh.append((report, diff))
            mutations += diff.mutations
            duplicates += len(diff.duplicates)
            if diff.duplicates:
                resend.add(report.machine_id)
        if stimulus.missed is not None:
            mutations += machines_down(core.state, stimulus.missed, rules.missed_polls_down)
        event_time = max((r.event_time_ms for r in stimulus.reports), default=0) or self.event_now_ms
        answer = AppliedReports(
            len(mutations), duplicates, frozenset(resend), frozenset(r.machine_id for r in stimulus.reports)
        )
        return Outcome(
            tuple(mutations),
            answer,
            stimulus.cause_id,
            event_time_ms=event_time,
            position=core.state.last_sequence,
            refresh=tuple(refresh),
        )

    # ------------------------------------------------------------------ scheduler proposals
    def _proposal(self, proposal: PlacementProposal) -> Outcome:
        """Judges each placement against the current state (Borg §3.4); binds the good ones in
        the master's view as it goes, so later ones of the proposal see the room they took."""
        core = self.core
        counts = core.proposals
        counts.proposals += 1
        cause = f"proposal-{proposal.scheduler_id}-{proposal.based_on_seq}"
        if proposal.epoch != core.epoch:
            refused = tuple(Refusal(p.key, "proposed to another master") for p in proposal.placements)
            counts.stale += len(refused)
            verdict = ProposalVerdict((), refused, wrong_epoch=True)
            return Outcome((), verdict, cause, position=core.state.last_sequence)
        mutations: list[Mutation] = []
        accepted = []
        refused_list = []
        preempted = 0
        if core.view.uses_gpa and proposal.placements:
            core.view.refresh_cpu_stats()  # judged with the CPU moments the scheduler planned with (GPA §4)
        for placement in proposal.placements:
            judged = core.view.accept(core.state, placement, self.event_now_ms, self.event_now_ms)
            if isinstance(judged, str):
                refused_list.append(Refusal(placement.key, judged))
                counts.stale_reasons[judged] = counts.stale_reasons.get(judged, 0) + 1
                continue
            accepted.append(placement.key)
            preempted += sum(1 for m in judged if not isinstance(m, TaskScheduled))
            mutations += judged
        if proposal.lava_hosts is not None and core.rules.keeps_lava_host_states:
            mutations.append(proposal.lava_hosts)
        counts.accepted += len(accepted)
        counts.stale += len(refused_list)
        counts.preempted += preempted
        verdict = ProposalVerdict(tuple(accepted), tuple(refused_list), preempted)
        return Outcome(
            tuple(mutations),
            verdict,
            cause,
            event_time_ms=self.event_now_ms,
            position=core.state.last_sequence,
        )

    # ------------------------------------------------------------------ timer
    def _tick(self) -> list[Mutation]:
        core = self.core
        state = core.state
        order = None
        if any(m.draining for m in state.machines.values()):
            tracker = core.lifetimes_synced(self.event_now_ms)
            order = lars_order(tracker.predicted) if tracker.active else None
        return rollout_step(state) + drain_step(state, core.rules.drain_evictions_per_pass, order)


def changed_machines(changes: list[Change]) -> set[str]:
    """Machines whose desired task set or state a record's changes touch (to poll them at once)."""
    return {machine for change in changes if (machine := getattr(change, "machine_id", ""))}
