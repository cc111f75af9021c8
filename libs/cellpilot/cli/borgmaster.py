"""``cellpilot borgmaster replay --to SEQ``: a Fauxmaster over the Borgmaster's checkpoint.

Borg §3.1: a checkpoint (a snapshot plus the change log) can restore the Borgmaster's state
at any point in the past; Fauxmaster reads it with the production Borgmaster code, answers
queries as if it were a live master, and can run "schedule all pending tasks" offline.
This command loads the newest snapshot at or before ``SEQ``, applies the log up to ``SEQ``
with the same core the replicas run, and answers read-only queries:

    cellpilot borgmaster replay --to 120                  # where the log is, what it holds
    cellpilot borgmaster replay --to 120 jobs [--json | -o wide]
    cellpilot borgmaster replay --to 120 job alice/web [--json]
    cellpilot borgmaster replay --to 120 machines [--json]
    cellpilot borgmaster replay --to 120 --schedule-pending [--json]

``--json`` prints what the gRPC API would answer (``GetJob``, ``ListJobs``,
``ListMachines`` messages as JSON). Nothing is ever written to the checkpoint.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from cellpilot.borg.cell_state import CellState, JobRecord, MachineRecord
from cellpilot.borg.lifecycle import TaskState
from cellpilot.borg.pending_reasons import explain
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.cli.output import Column, OutputOption, print_table, use_output
from cellpilot.cli.text_file import TextFileError, read_text_file
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.store_outage import POSTGRES, describe, store_of
from cellpilot.schedule import default_profile
from cellpilot.security.store_secrets import FAUXMASTER_ACCOUNT, StoreSecretError
from cellpilot.units import GIB

app = typer.Typer(
    help="The Borgmaster's checkpoint: replay it, query it, schedule offline.", no_args_is_help=True
)
console = Console()
errors = Console(stderr=True)

QUERIES = ("jobs", "job", "machines")
MAX_ENV_FILE_BYTES = 1 << 20


@app.callback()
def borgmaster() -> None:
    """The Borgmaster's checkpoint: replay it, query it, schedule offline (Borg §3.1 Fauxmaster)."""


async def load_state(database_url: str, to_seq: int | None) -> tuple[CellState, int, int]:
    """The state at ``to_seq`` (the log head if None); also the snapshot used and the log head."""
    from cellpilot.checkpoint_store import PostgresCheckpointStore

    store = PostgresCheckpointStore.connect(database_url, pool_size=1)
    try:
        head = await store.last_sequence()
        target = head if to_seq is None else to_seq
        if target < 0 or target > head:
            raise typer.BadParameter(f"--to {target}: the log holds positions 0..{head}")
        snapshot = await store.latest_snapshot(at_or_before=target)
        state = snapshot.state if snapshot is not None else CellState()
        while state.last_sequence < target:
            records = await store.read(state.last_sequence, up_to_seq=target, limit=5000)
            if not records:
                raise typer.BadParameter(f"the log has a gap after position {state.last_sequence}")
            state.apply_all(records)
        return state, snapshot.sequence if snapshot is not None else 0, head
    finally:
        await store.close()


def _json(messages: Any) -> str:
    from google.protobuf.json_format import MessageToDict

    if isinstance(messages, list):
        return json.dumps([MessageToDict(m) for m in messages], indent=2, sort_keys=True)
    return json.dumps(MessageToDict(messages), indent=2, sort_keys=True)


def jobs_json(state: CellState) -> str:
    from cellpilot.borg_wire import statuses

    return _json([statuses.job_status_out(state.jobs[j]) for j in sorted(state.jobs)])


def job_json(state: CellState, job_id: str) -> str:
    from cellpilot.borg_wire import statuses

    return _json(statuses.job_status_out(state.jobs[job_id], include_tasks=True))


def machines_json(state: CellState) -> str:
    from cellpilot.borg_wire import statuses

    return _json([statuses.machine_out(state, state.machines[m]) for m in sorted(state.machines)])


def _print_jobs(state: CellState) -> None:
    def count(of: TaskState) -> Column:
        return Column(of.value, lambda job: str(job.task_counts()[of]))

    columns = (
        Column("job", lambda job: job.job_id, identifier=True),
        Column("state", lambda job: job.state.value),
        Column("priority", lambda job: str(job.spec.priority)),
        Column("version", lambda job: str(job.spec_version)),
        *(count(s) for s in (TaskState.PENDING, TaskState.RUNNING, TaskState.DEAD)),
    )
    jobs: list[JobRecord] = [state.jobs[job_id] for job_id in sorted(state.jobs)]
    print_table(f"jobs at log position {state.last_sequence}", columns, jobs)


TASK_COLUMNS: tuple[Column, ...] = (
    Column("task", lambda task: str(task.index), identifier=True),
    Column("state", lambda task: task.state.value),
    Column("reason", lambda task: task.reason.value),
    Column("machine", lambda task: task.machine_id or "-", identifier=True),
    Column("incarnation", lambda task: str(task.incarnation)),
    Column("restarts", lambda task: str(task.restarts)),
    Column("detail", lambda task: escape(task.reason_detail), prose=True),
)


def _print_job(state: CellState, job_id: str) -> None:
    job = state.jobs[job_id]
    limits = job.spec.task.limits
    console.print(
        f"[bold]{job_id}[/bold] {job.state.value}, spec version {job.spec_version}, "
        f"priority {job.spec.priority}, {job.spec.task_count} tasks of {limits.cpu / 1000:g} cores, "
        f"{limits.ram / GIB:.3g} GiB"
    )
    print_table(None, TASK_COLUMNS, job.visible_tasks())


def _print_machines(state: CellState) -> None:
    def used(machine: MachineRecord) -> tuple[float, float]:
        tasks = [task for _, task in state.tasks_on(machine.spec.machine_id)]
        return sum(t.limits.cpu for t in tasks), sum(t.limits.ram for t in tasks)

    def share(machine: MachineRecord, resource: int) -> str:
        cap = machine.spec.capacity
        if resource == 0:
            return f"{used(machine)[0] / 1000:g}/{cap.cpu / 1000:g}"
        return f"{used(machine)[1] / GIB:.3g}/{cap.ram / GIB:.3g}"

    columns = (
        Column("machine", lambda machine: machine.spec.machine_id, identifier=True),
        Column("state", lambda machine: machine.availability.value),
        Column("tasks", lambda machine: str(len(machine.tasks))),
        Column("cpu used/cap (cores)", lambda machine: share(machine, 0)),
        Column("ram used/cap (GiB)", lambda machine: share(machine, 1)),
    )
    machines = [state.machines[machine_id] for machine_id in sorted(state.machines)]
    print_table(f"machines at log position {state.last_sequence}", columns, machines)


def schedule_pending(state: CellState, packing: str, as_json: bool) -> None:
    """Fauxmaster's "schedule all pending": a pass over a copy of the restored state, nothing written."""
    from cellpilot.borg.mutations import TaskScheduled, TaskStateChanged

    view = SchedulingView.build(state, default_profile(packing))
    pending = len(state.schedulable_pending())
    plan = view.plan(state, state.event_time_ms, max_tasks=1_000_000)
    placements = [
        {"task": f"{m.job_id}/{m.task_index}", "machine": m.machine_id, "incarnation": m.incarnation}
        for m in plan.mutations
        if isinstance(m, TaskScheduled)
    ]
    preempted = [
        {"task": f"{m.job_id}/{m.task_index}", "detail": m.detail}
        for m in plan.mutations
        if isinstance(m, TaskStateChanged)
    ]
    placed = {p["task"] for p in placements}
    reasons: list[dict[str, str]] = []
    for job, task in state.schedulable_pending():
        if f"{job.job_id}/{task.index}" not in placed and len(reasons) < 20:
            reasons.append(
                {
                    "task": f"{job.job_id}/{task.index}",
                    "why": explain(view, state, job.job_id, task.index).summary,
                }
            )
    if as_json:
        result = {
            "log_sequence": state.last_sequence,
            "pending": pending,
            "placements": placements,
            "preempted": preempted,
            "still_pending": pending - len(placements),
            "why_pending": reasons,
        }
        typer.echo(json.dumps(result, indent=2))
        return
    title = (
        f"{len(placements)} of {pending} pending tasks would schedule (log position {state.last_sequence})"
    )
    columns = (
        Column("task", lambda p: str(p["task"]), identifier=True),
        Column("machine", lambda p: str(p["machine"]), identifier=True),
    )
    print_table(title, columns, placements)
    for victim in preempted:
        console.print(f"preempts {victim['task']}: {victim['detail']}")
    for reason in reasons:
        console.print(f"[yellow]still pending[/yellow] {reason['why']}")


@app.command()
def replay(
    query: Annotated[
        list[str] | None, typer.Argument(help="jobs | job <user>/<name> | machines (none: a summary)")
    ] = None,
    to: Annotated[
        int | None, typer.Option("--to", help="Log position to restore (default: the head).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the API's messages as JSON.")] = False,
    output: OutputOption = "",
    schedule: Annotated[
        bool,
        typer.Option("--schedule-pending", help="Run a scheduling pass offline over the restored state."),
    ] = False,
    packing: Annotated[str, typer.Option(help="Packing scorer for --schedule-pending.")] = "hybrid",
    database_url: Annotated[
        str | None, typer.Option(help="PostgreSQL URL of the checkpoint (default: the stack's settings).")
    ] = None,
    stack_env: Annotated[
        Path | None,
        typer.Option(help="The stack's stack.env (default: CELLPILOT_STACK_ENV or .cellpilot/stack)."),
    ] = None,
) -> None:
    """Restore the Borgmaster's state at a log position and query it read-only (Fauxmaster, Borg §3.1)."""
    as_json = use_output(output, as_json)
    words = list(query or [])
    if words and words[0] not in QUERIES:
        raise typer.BadParameter(f"unknown query {words[0]!r}; one of {', '.join(QUERIES)}")
    if stack_env is not None:
        try:
            read_text_file(stack_env, "env", MAX_ENV_FILE_BYTES)
        except TextFileError as error:
            raise typer.BadParameter(str(error), param_hint="--stack-env") from None
    try:
        # Read-only: the stack's `fauxmaster` role may only SELECT the checkpoint tables.
        url = database_url or PlatformSettings.load(stack_env).postgres_url_for(FAUXMASTER_ACCOUNT)
    except StoreSecretError as error:
        errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    try:
        state, snapshot_seq, head = asyncio.run(load_state(url, to))
    except Exception as error:
        store = store_of(error, default=POSTGRES)
        if store is None:
            raise
        detail = escape(describe(error))
        errors.print(
            f"[red]error:[/red] cannot read the checkpoint: {store} is unreachable ({detail})",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    if words and words[0] == "job" and (len(words) != 2 or words[1] not in state.jobs):
        missing = words[1] if len(words) > 1 else "(missing id)"
        errors.print(f"[red]no job {missing} at position {state.last_sequence}[/red]")
        raise typer.Exit(1)
    if schedule:
        schedule_pending(state, packing, as_json)
        return
    if not words:
        summary = {
            "log_sequence": state.last_sequence,
            "log_head": head,
            "from_snapshot": snapshot_seq,
            "jobs": len(state.jobs),
            "machines": len(state.machines),
            "pending_tasks": len(state.pending),
            "leader": state.leader.replica_id if state.leader else None,
        }
        typer.echo(
            json.dumps(summary, indent=2) if as_json else "\n".join(f"{k}: {v}" for k, v in summary.items())
        )
        return
    if words[0] == "jobs":
        typer.echo(jobs_json(state)) if as_json else _print_jobs(state)
    elif words[0] == "job":
        typer.echo(job_json(state, words[1])) if as_json else _print_job(state, words[1])
    else:
        typer.echo(machines_json(state)) if as_json else _print_machines(state)
