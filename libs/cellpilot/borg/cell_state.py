"""The Borgmaster's logical state and its one deterministic entry point, :meth:`CellState.apply`.

Borg §3.1: each replica keeps an in-memory copy of the cell's state, which is also the
result of replaying the checkpoint (a snapshot plus the change log). Everything here is a
pure function of the log: applying the same records to the same state always gives the
same state and the same :mod:`changes`, so a follower's warm copy, a promoted master and
the Fauxmaster replay tool agree. Soft state that polls refresh every few seconds (usage,
reservations, last contact) is not here: it lives with the service and is not logged.

State changes go through the transition tables of :mod:`cellpilot.borg.lifecycle`; a
record the tables refuse raises :class:`InvariantError` (the log and the code disagree).
Consequences are derived here, not logged separately: a killed job kills its tasks, a
machine marked down loses its tasks (Borg §3.3), a job whose first task runs becomes
RUNNING (Figure 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cellpilot.borg.changes import (
    Change,
    JobChange,
    JobEventKind,
    MachineChange,
    MachineEventKind,
    TaskChange,
)
from cellpilot.borg.lifecycle import (
    JOB_TRANSITIONS,
    MACHINE_TRANSITIONS,
    TASK_TRANSITIONS,
    JobEvent,
    JobState,
    MachineEvent,
    MachineState,
    TaskEvent,
    TaskState,
    transition,
)
from cellpilot.borg.model import JobSpec, MachineAvailability, needs_restart, runs_same
from cellpilot.borg.mutations import (
    JobKilled,
    JobStateChanged,
    JobSubmitted,
    JobUpdated,
    LavaHost,
    LavaHostsChanged,
    LeaderElected,
    LifetimeModelTrained,
    LogRecord,
    MachineRegistered,
    MachineStateChanged,
    QuotaSet,
    TaskScheduled,
    TaskStateChanged,
)
from cellpilot.borg.records import (  # re-exported: the records are part of this module's API
    UNLIMITED,
    AppliedRequest,
    InvariantError,
    JobRecord,
    Leader,
    MachineRecord,
    TaskKey,
    TaskRecord,
)
from cellpilot.borg.restart_backoff import clear_backoff, record_failure
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Admitted, PlacementJob, QuotaBook, Resources
from cellpilot.schedule import TaskShape as ScheduleShape

# Jobs whose pending tasks the scheduler may place (admitted, not held for Autopilot, not dead).
RELEASED = (JobState.PENDING, JobState.RUNNING)


def schedule_job(spec: JobSpec) -> PlacementJob:
    """The job as the scheduling core's quota book sees it (Borg §2.5)."""
    shape = ScheduleShape(
        priority=spec.priority,
        limits=spec.task.limits,
        alloc_set=spec.alloc_set_job_id or None,
        is_alloc=spec.is_alloc_set,
    )
    return PlacementJob(spec.job_id, spec.user, spec.task_count, shape)


def mutation_job_id(mutation: object) -> str:
    return str(getattr(mutation, "job_id", ""))


class CellState:
    """Jobs, tasks, machines, quotas and applied request ids, at log position ``last_sequence``."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}
        self.machines: dict[str, MachineRecord] = {}
        self.quotas: dict[tuple[str, PriorityBand], Resources] = {}
        self.quota_book = QuotaBook()
        self.applied_requests: dict[str, AppliedRequest] = {}
        self.last_sequence = 0
        self.last_epoch = 0
        self.event_time_ms = 0
        self.leader: Leader | None = None
        self.pending: set[TaskKey] = set()  # PENDING tasks of every job (held ones included)
        self.rolling: set[str] = set()  # jobs that may still run tasks of an older spec version
        self.lava_hosts: dict[str, LavaHost] = {}  # LAVA §4.3 states of the machines not empty
        self.lifetime_model: LifetimeModelTrained | None = None  # LAVA §3

    # ------------------------------------------------------------------ queries
    def job(self, job_id: str) -> JobRecord | None:
        return self.jobs.get(job_id)

    def task(self, key: TaskKey) -> TaskRecord | None:
        job = self.jobs.get(key[0])
        return None if job is None else job.tasks.get(key[1])

    def schedulable_pending(self, now_ms: int | None = None) -> list[tuple[JobRecord, TaskRecord]]:
        """Pending tasks of admitted, released jobs, in a deterministic order.

        With ``now_ms`` (event time), tasks still backing off after a failure are left out.
        """
        out = []
        for job_id, index in sorted(self.pending):
            job = self.jobs[job_id]
            if job.state in RELEASED:
                task = job.tasks[index]
                if now_ms is None or task.not_before_ms <= now_ms:
                    out.append((job, task))
        return out

    def schedulable_pending_count(self) -> int:
        """``len(schedulable_pending())``, without listing and sorting the tasks (a status read)."""
        return sum(1 for job_id, _ in self.pending if self.jobs[job_id].state in RELEASED)

    def next_restart_ms(self, now_ms: int) -> int:
        """The earliest event time after ``now_ms`` at which a backing-off task may restart (0: none)."""
        times = [self.jobs[job_id].tasks[index].not_before_ms for job_id, index in self.pending]
        return min((t for t in times if t > now_ms), default=0)

    def tasks_on(self, machine_id: str) -> list[tuple[JobRecord, TaskRecord]]:
        machine = self.machines[machine_id]
        return [(self.jobs[j], self.jobs[j].tasks[i]) for j, i in sorted(machine.tasks)]

    def ports_in_use(self, machine_id: str) -> set[int]:
        jobs = self.jobs
        return {port for j, i in self.machines[machine_id].tasks for port in jobs[j].tasks[i].ports}

    def quota_used(self, user: str, band: PriorityBand) -> Resources:
        return self.quota_book.used(user, band)

    def up_machines(self) -> int:
        return sum(1 for m in self.machines.values() if m.state is MachineState.UP)

    # ------------------------------------------------------------------ apply
    def apply(self, record: LogRecord) -> list[Change]:
        """Applies one log record; returns what changed (the events to publish)."""
        if record.sequence != self.last_sequence + 1:
            raise InvariantError(
                f"record {record.sequence} does not follow the applied position {self.last_sequence}"
            )
        m = record.mutation
        changes: list[Change] = []
        _APPLY[type(m)](self, record, m, changes)
        if record.request_id and record.request_id not in self.applied_requests:
            self.applied_requests[record.request_id] = AppliedRequest(
                record.request_id,
                record.sequence,
                mutation_job_id(m),
                record.request_method,
                record.request_digest,
            )
        self.last_sequence = record.sequence
        self.last_epoch = record.epoch
        self.event_time_ms = record.event_time_ms
        return changes

    def apply_all(self, records: Iterable[LogRecord]) -> list[Change]:
        out: list[Change] = []
        for record in records:
            out += self.apply(record)
        return out

    # ------------------------------------------------------------------ jobs
    def _live_job(self, job_id: str) -> JobRecord:
        job = self.jobs.get(job_id)
        if job is None or not job.live:
            raise InvariantError(f"no live job {job_id}")
        return job

    def _job_state_changed(self, rec: LogRecord, m: JobStateChanged, changes: list[Change]) -> None:
        job = self._live_job(m.job_id)
        if not any(s is m.state for s in JOB_TRANSITIONS[job.state].values()):
            raise InvariantError(f"job {m.job_id} cannot go from {job.state.value} to {m.state.value}")
        self._set_job_state(rec, job, m.state, JobEventKind.STATE_CHANGED, changes)

    def _job_submitted(self, rec: LogRecord, m: JobSubmitted, changes: list[Change]) -> None:
        old = self.jobs.get(m.job_id)
        if old is not None and old.live:
            raise InvariantError(f"job {m.job_id} already exists")
        if m.spec.job_id != m.job_id or m.state not in (JobState.PENDING, JobState.HELD_FOR_AUTOPILOT):
            raise InvariantError(f"malformed submission of {m.job_id}")
        if not isinstance(self.quota_book.admit(schedule_job(m.spec)), Admitted):
            raise InvariantError(f"job {m.job_id} is over quota when replayed")
        t = rec.event_time_ms
        job = JobRecord(m.spec, 1, m.state, t, t)
        self.jobs[m.job_id] = job
        changes.append(
            JobChange(m.job_id, JobEventKind.SUBMITTED, m.state, m.spec, 1, t, rec.sequence, rec.cause_id)
        )
        for index in range(m.spec.task_count):
            # A resubmitted job name continues its old tasks' incarnations, so a Borglet that
            # still runs an old incarnation is recognised as running a duplicate (Borg §3.3).
            previous = old.tasks[index].incarnation if old is not None and index in old.tasks else 0
            self._new_task(rec, job, index, previous, changes)

    def _new_task(
        self, rec: LogRecord, job: JobRecord, index: int, incarnation: int, changes: list[Change]
    ) -> None:
        task = TaskRecord(
            job.job_id,
            index,
            job.spec.task.limits,
            job.spec_version,
            incarnation,
            state_since_ms=rec.event_time_ms,
        )
        job.tasks[index] = task
        job.counts[TaskState.PENDING] += 1
        self.pending.add(task.key)
        changes.append(self._task_change(rec, task, TaskEvent.SUBMITTED, ""))

    def _job_updated(self, rec: LogRecord, m: JobUpdated, changes: list[Change]) -> None:
        job = self._live_job(m.job_id)
        if m.spec.job_id != m.job_id or m.spec_version != job.spec_version + 1:
            raise InvariantError(f"update of {m.job_id} to version {m.spec_version} is out of order")
        if not isinstance(self.quota_book.update(schedule_job(m.spec)), Admitted):
            raise InvariantError(f"update of {m.job_id} is over quota when replayed")
        old_spec, old_version = job.spec, job.spec_version
        if needs_restart(old_spec, m.spec):
            for record in job.tasks.values():
                clear_backoff(record)  # a new binary may fix the crash: restart without delay
        job.spec = m.spec
        job.spec_version = m.spec_version
        job.fencing_token = max(job.fencing_token, m.fencing_token)
        job.max_disruptions = m.max_disruptions
        t = rec.event_time_ms
        if m.hold_released:
            self._set_job_state(rec, job, JobState.PENDING, JobEventKind.RELEASED, changes, JobEvent.RELEASED)
        changes.append(
            JobChange(
                m.job_id,
                JobEventKind.UPDATED,
                job.state,
                m.spec,
                m.spec_version,
                t,
                rec.sequence,
                rec.cause_id,
            )
        )
        limits = m.spec.task.limits
        for index in range(m.spec.task_count):
            task = job.tasks.get(index)
            if task is None:
                self._new_task(rec, job, index, 0, changes)
            elif task.state is TaskState.DEAD:
                self._set_task_state(job, task, TaskEvent.SUBMITTED, rec)
                task.limits, task.spec_version, task.reason_detail = limits, m.spec_version, ""
                changes.append(self._task_change(rec, task, TaskEvent.SUBMITTED, ""))
            elif task.state is TaskState.PENDING:
                changed = task.limits != limits
                task.limits, task.spec_version = limits, m.spec_version
                if changed:
                    changes.append(self._task_change(rec, task, TaskEvent.UPDATED, "", task.limits))
        for task in job.tasks.values():
            if task.state is not TaskState.RUNNING or task.spec_version != old_version:
                continue
            if runs_same(old_spec, m.spec):
                task.spec_version = m.spec_version  # nothing to change on its machine
            else:
                self.rolling.add(m.job_id)  # the decision updates it in place or rolls it
        if any(t.state is TaskState.RUNNING and t.spec_version < m.spec_version for t in job.tasks.values()):
            self.rolling.add(m.job_id)
        self._derive_job_state(rec, job, changes)

    def _job_killed(self, rec: LogRecord, m: JobKilled, changes: list[Change]) -> None:
        job = self._live_job(m.job_id)
        for task in sorted(job.tasks.values(), key=lambda t: t.index):
            if task.state is TaskState.DEAD:
                continue
            machine = task.machine_id
            self._set_task_state(job, task, TaskEvent.KILLED, rec)
            task.reason_detail = "job killed"
            changes.append(self._task_change(rec, task, TaskEvent.KILLED, machine))
        self._set_job_state(rec, job, JobState.DEAD, JobEventKind.KILLED, changes, JobEvent.KILLED)

    def _set_job_state(
        self,
        rec: LogRecord,
        job: JobRecord,
        state: JobState,
        kind: JobEventKind,
        changes: list[Change],
        event: JobEvent | None = None,
    ) -> None:
        if event is not None:
            result = transition(JOB_TRANSITIONS, job.state, event)
            if not result.allowed or result.state is not state:
                raise InvariantError(f"job {job.job_id}: {result.reason or 'unexpected state'}")
        job.state = state
        job.state_since_ms = rec.event_time_ms
        if state is JobState.DEAD:
            self.quota_book.release(job.job_id)
            self.rolling.discard(job.job_id)
        changes.append(
            JobChange(
                job.job_id, kind, state, None, job.spec_version, rec.event_time_ms, rec.sequence, rec.cause_id
            )
        )

    def _derive_job_state(self, rec: LogRecord, job: JobRecord, changes: list[Change]) -> None:
        """Figure 2 for jobs: RUNNING while a task runs, DEAD once every task is dead."""
        if job.state in (JobState.HELD_FOR_AUTOPILOT, JobState.DEAD):
            return
        running, pending = job.counts[TaskState.RUNNING], job.counts[TaskState.PENDING]
        event = None
        if job.state is JobState.PENDING and running:
            event = JobEvent.TASK_STARTED
        elif job.state is JobState.RUNNING and not running and pending:
            event = JobEvent.ALL_TASKS_STOPPED
        elif not running and not pending:
            event = JobEvent.ALL_TASKS_DEAD
        if event is not None:
            result = transition(JOB_TRANSITIONS, job.state, event)
            self._set_job_state(rec, job, result.state, JobEventKind.STATE_CHANGED, changes, event)

    # ------------------------------------------------------------------ tasks
    def _set_task_state(self, job: JobRecord, task: TaskRecord, event: TaskEvent, rec: LogRecord) -> None:
        result = transition(TASK_TRANSITIONS, task.state, event)
        if not result.allowed:
            raise InvariantError(f"task {task.job_id}/{task.index}: {result.reason}")
        before, after = task.state, result.state
        if before is TaskState.RUNNING and after is not TaskState.RUNNING:
            machine = self.machines.get(task.machine_id)
            if machine is not None:
                machine.tasks.discard(task.key)
                machine.desired_version = rec.sequence
            task.machine_id, task.ports = "", ()
        if before is TaskState.PENDING:
            self.pending.discard(task.key)
        if after is TaskState.PENDING:
            self.pending.add(task.key)
            task.limits, task.spec_version = job.spec.task.limits, job.spec_version
        job.counts[before] -= 1
        job.counts[after] += 1
        if before is not after or event is TaskEvent.RUNNING:
            task.reason = event
            task.state_since_ms = rec.event_time_ms if before is not after else task.state_since_ms
        task.state = after

    def _task_change(
        self,
        rec: LogRecord,
        task: TaskRecord,
        kind: TaskEvent,
        machine_id: str,
        limits: Resources | None = None,
        usage: Resources | None = None,
    ) -> TaskChange:
        return TaskChange(
            task.job_id,
            task.index,
            task.incarnation,
            kind,
            task.state,
            machine_id,
            rec.event_time_ms,
            rec.sequence,
            rec.cause_id,
            task.reason_detail if kind is not TaskEvent.UPDATED else "",
            limits if limits is not None else task.limits,
            usage,
        )

    def _task_scheduled(self, rec: LogRecord, m: TaskScheduled, changes: list[Change]) -> None:
        job = self._live_job(m.job_id)
        task = job.tasks.get(m.task_index)
        machine = self.machines.get(m.machine_id)
        if task is None or machine is None or machine.state is not MachineState.UP:
            raise InvariantError(f"cannot schedule {m.job_id}/{m.task_index} on {m.machine_id}")
        if job.state is JobState.HELD_FOR_AUTOPILOT or m.incarnation <= task.incarnation:
            raise InvariantError(f"task {m.job_id}/{m.task_index} scheduled out of order")
        self._set_task_state(job, task, TaskEvent.SCHEDULED, rec)
        if task.incarnation > 0:
            task.restarts += 1
        task.incarnation = m.incarnation
        task.machine_id, task.ports, task.limits = m.machine_id, m.ports, m.limits
        task.spec_version, task.reason_detail = job.spec_version, ""
        machine.tasks.add(task.key)
        machine.desired_version = rec.sequence
        changes.append(self._task_change(rec, task, TaskEvent.SCHEDULED, m.machine_id))
        self._derive_job_state(rec, job, changes)

    def _task_state_changed(self, rec: LogRecord, m: TaskStateChanged, changes: list[Change]) -> None:
        job = self._live_job(m.job_id)
        task = job.tasks.get(m.task_index)
        if task is None or task.incarnation != m.incarnation:
            raise InvariantError(f"task {m.job_id}/{m.task_index} incarnation {m.incarnation} is not current")
        expected = transition(TASK_TRANSITIONS, task.state, m.reason)
        if not expected.allowed or expected.state is not m.state:
            raise InvariantError(f"task {m.job_id}/{m.task_index}: {expected.reason or 'unexpected state'}")
        machine = task.machine_id
        if m.reason is TaskEvent.UPDATED:
            task.limits, task.spec_version = job.spec.task.limits, job.spec_version
            if task.state is TaskState.RUNNING:
                self.machines[machine].desired_version = rec.sequence
            changes.append(self._task_change(rec, task, TaskEvent.UPDATED, machine, usage=m.usage))
            self._maybe_done_rolling(job)
            return
        limits = task.limits
        self._set_task_state(job, task, m.reason, rec)
        task.reason_detail = m.detail
        if m.backoff is not None:
            record_failure(task, m.backoff, m.reason, m.detail)
        changes.append(self._task_change(rec, task, m.reason, machine, limits, m.usage))
        self._maybe_done_rolling(job)
        self._derive_job_state(rec, job, changes)

    def _maybe_done_rolling(self, job: JobRecord) -> None:
        if job.job_id in self.rolling and not any(
            t.state is TaskState.RUNNING and t.spec_version < job.spec_version for t in job.tasks.values()
        ):
            self.rolling.discard(job.job_id)

    # ------------------------------------------------------------------ machines
    def _machine_registered(self, rec: LogRecord, m: MachineRegistered, changes: list[Change]) -> None:
        machine = self.machines.get(m.spec.machine_id)
        if machine is None:
            machine = MachineRecord(m.spec, state_since_ms=rec.event_time_ms)
            self.machines[m.spec.machine_id] = machine
        else:
            result = transition(MACHINE_TRANSITIONS, machine.state, MachineEvent.REGISTERED)
            if result.state is not machine.state:
                machine.state_since_ms = rec.event_time_ms
            machine.spec, machine.state = m.spec, result.state
        machine.desired_version = rec.sequence
        changes.append(
            MachineChange(
                m.spec.machine_id,
                MachineEventKind.REGISTERED,
                machine.availability,
                m.spec.borglet_address,
                rec.event_time_ms,
                rec.sequence,
                rec.cause_id,
            )
        )

    def _machine_state_changed(self, rec: LogRecord, m: MachineStateChanged, changes: list[Change]) -> None:
        machine = self.machines.get(m.machine_id)
        if machine is None:
            raise InvariantError(f"no machine {m.machine_id}")
        lost: list[TaskChange] = []
        if m.state is MachineAvailability.DOWN:
            result = transition(MACHINE_TRANSITIONS, machine.state, MachineEvent.POLLS_MISSED)
            if not result.allowed:
                raise InvariantError(f"machine {m.machine_id}: {result.reason}")
            machine.state = result.state
            # Borg §3.3: a machine that misses several polls is down; its tasks are rescheduled.
            for job, task in self.tasks_on(m.machine_id):
                self._set_task_state(job, task, TaskEvent.LOST, rec)
                task.reason_detail = f"machine {m.machine_id} down: {m.detail}".rstrip(": ")
                lost.append(self._task_change(rec, task, TaskEvent.LOST, m.machine_id))
        elif m.state is MachineAvailability.UP:
            if machine.state is MachineState.DOWN:
                machine.state = transition(
                    MACHINE_TRANSITIONS, machine.state, MachineEvent.POLL_ANSWERED
                ).state
            machine.draining = False
        elif m.state is MachineAvailability.DRAINING:
            if machine.state is not MachineState.UP:
                raise InvariantError(f"machine {m.machine_id} is not up; it cannot drain")
            machine.draining = True
        else:
            raise InvariantError(f"machine state {m.state.value} cannot be recorded")
        machine.state_since_ms = rec.event_time_ms
        machine.desired_version = rec.sequence
        changes.append(
            MachineChange(
                m.machine_id,
                MachineEventKind.STATE_CHANGED,
                machine.availability,
                m.detail,
                rec.event_time_ms,
                rec.sequence,
                rec.cause_id,
            )
        )
        changes += lost
        for job_id in sorted({c.job_id for c in lost}):
            self._derive_job_state(rec, self.jobs[job_id], changes)

    # ------------------------------------------------------------------ cell-wide
    def _quota_set(self, rec: LogRecord, m: QuotaSet, changes: list[Change]) -> None:
        self.quotas[(m.user, m.band)] = m.limit
        self.quota_book.set_quota(m.user, m.band, m.limit)

    def _leader_elected(self, rec: LogRecord, m: LeaderElected, changes: list[Change]) -> None:
        self.leader = Leader(m.replica_id, m.address, m.epoch)

    def _lava_hosts_changed(self, rec: LogRecord, m: LavaHostsChanged, changes: list[Change]) -> None:
        for host in m.hosts:
            self.lava_hosts.pop(host.machine_id, None)
            if host.lifetime_class >= 0:
                self.lava_hosts[host.machine_id] = host

    def _lifetime_model_trained(self, rec: LogRecord, m: LifetimeModelTrained, changes: list[Change]) -> None:
        self.lifetime_model = m

    # ------------------------------------------------------------------ restore
    @classmethod
    def restore(
        cls,
        jobs: Iterable[JobRecord],
        machines: Iterable[MachineRecord],
        quotas: Iterable[tuple[str, PriorityBand, Resources]],
        applied: Iterable[AppliedRequest],
        sequence: int,
        epoch: int,
        event_time_ms: int,
        leader: Leader | None,
        lava_hosts: Iterable[LavaHost] = (),
        lifetime_model: LifetimeModelTrained | None = None,
    ) -> CellState:
        """Rebuilds a state (and its indexes) from a snapshot's parts."""
        state = cls()
        state.machines = {m.machine_id: m for m in machines}
        for machine in state.machines.values():
            machine.tasks = set()
            machine.desired_version = sequence
        # Live jobs were admitted when they were submitted, even if a quota was lowered since:
        # charge them against unlimited quota first, then set the real quotas.
        for job in jobs:
            state.jobs[job.job_id] = job
            job.counts = dict.fromkeys(TaskState, 0)
            for task in job.tasks.values():
                job.counts[task.state] += 1
                if task.state is TaskState.PENDING:
                    state.pending.add(task.key)
                elif task.state is TaskState.RUNNING:
                    state.machines[task.machine_id].tasks.add(task.key)
                    if task.spec_version < job.spec_version:
                        state.rolling.add(job.job_id)
            if job.live:
                state.quota_book.set_quota(job.spec.user, job.spec.effective_band, UNLIMITED)
                state.quota_book.admit(schedule_job(job.spec))
        for user, band, limit in quotas:
            state.quotas[(user, band)] = limit
        for job in state.jobs.values():
            if job.live:
                state.quota_book.set_quota(job.spec.user, job.spec.effective_band, Resources())
        for (user, band), limit in state.quotas.items():
            state.quota_book.set_quota(user, band, limit)
        state.applied_requests = {a.request_id: a for a in applied}
        state.last_sequence, state.last_epoch, state.event_time_ms = sequence, epoch, event_time_ms
        state.leader = leader
        state.lava_hosts = {h.machine_id: h for h in lava_hosts}
        state.lifetime_model = lifetime_model
        return state

    def describe(self) -> dict[str, object]:
        """The logical state as plain data: equal for two replicas that applied the same log."""
        jobs = {
            job_id: {
                "spec": job.spec,
                "spec_version": job.spec_version,
                "state": job.state.value,
                "submitted_ms": job.submitted_ms,
                "state_since_ms": job.state_since_ms,
                "fencing_token": job.fencing_token,
                "max_disruptions": job.max_disruptions,
                "tasks": {i: dict(vars(t)) for i, t in sorted(job.tasks.items())},
            }
            for job_id, job in sorted(self.jobs.items())
        }
        machines = {
            machine_id: {
                "spec": m.spec,
                "state": m.availability.value,
                "draining": m.draining,  # also while down: it is still draining when it returns
                "state_since_ms": m.state_since_ms,
                "tasks": sorted(m.tasks),
            }
            for machine_id, m in sorted(self.machines.items())
        }
        return {
            "jobs": jobs,
            "machines": machines,
            "quotas": {f"{u}:{b.value}": limit for (u, b), limit in sorted(self.quotas.items(), key=str)},
            "applied_requests": dict(sorted(self.applied_requests.items())),
            "last_sequence": self.last_sequence,
            "leader": self.leader,
            "pending": sorted(self.pending),
            "lava_hosts": dict(sorted(self.lava_hosts.items())),
            "lifetime_model": self.lifetime_model,
        }

    def iter_tasks(self) -> Iterator[tuple[JobRecord, TaskRecord]]:
        for job in self.jobs.values():
            for task in job.tasks.values():
                yield job, task


# How CellState.apply applies each kind of mutation (mutations.KINDS lists the same kinds).
_APPLY: dict[type, Callable[[CellState, LogRecord, Any, list[Change]], None]] = {
    JobSubmitted: CellState._job_submitted,
    JobUpdated: CellState._job_updated,
    JobKilled: CellState._job_killed,
    JobStateChanged: CellState._job_state_changed,
    TaskScheduled: CellState._task_scheduled,
    TaskStateChanged: CellState._task_state_changed,
    MachineRegistered: CellState._machine_registered,
    MachineStateChanged: CellState._machine_state_changed,
    QuotaSet: CellState._quota_set,
    LeaderElected: CellState._leader_elected,
    LavaHostsChanged: CellState._lava_hosts_changed,
    LifetimeModelTrained: CellState._lifetime_model_trained,
}
