"""``cellpilot job submit|list|show|kill|update|why-pending``: jobs at the live Borgmaster.

cellpilot job submit web.yaml            # a YAML spec (cellpilot.client.job_spec_file)
cellpilot job list [--user alice] [--state running] [--json]
cellpilot job show alice/web [--json]
cellpilot job update alice/web --tasks 5 --cpu 750m --memory 2Gi
cellpilot job why-pending alice/web [--task 3] [--json]
cellpilot job kill alice/web
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.markup import escape

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, resources_pb2, state_pb2
from cellpilot.cli.output import (
    DEFAULT_BORGMASTER,
    BorgmasterOption,
    BorgmasterQuery,
    Column,
    TimeoutOption,
    borgmaster_command,
    connect,
    console,
    errors,
    print_table,
    state_filter,
)
from cellpilot.cli.text_file import TextFileError, read_text_file
from cellpilot.client import job_spec_file
from cellpilot.client.wording import autopilot_modes, cores, enum_label, gib

app = typer.Typer(help="Submit, inspect, change and kill jobs (Borg §2).", no_args_is_help=True)

MAX_SPEC_BYTES = 1 << 20  # a job spec is a page of YAML; a file near this size is a mistake
JobArgument = Annotated[str, typer.Argument(help="The job, <user>/<name>.", show_default=False)]
STATES = {enum_label(state_pb2.JobState, v, "JOB_STATE_"): v for v in state_pb2.JobState.values() if v}


def job_id(value: str) -> str:
    user, _, name = value.partition("/")
    if not user or not name or "/" in name:
        raise typer.BadParameter(f"{value!r}: a job is named <user>/<name>, e.g. alice/web")
    return value


def quantity(option: str, text: str, kind: str) -> int:
    """Parse ``--cpu 500m`` / ``--memory 2Gi`` with the spec file's rules, naming the option."""
    node = job_spec_file._Node(yaml.compose(f'"{text}"') or yaml.ScalarNode("", text), option)
    try:
        return job_spec_file._millicores(node) if kind == "cpu" else job_spec_file._bytes(node)
    except job_spec_file.JobSpecError as error:
        raise typer.BadParameter(error.message, param_hint=option) from None


@borgmaster_command(app)
def submit(
    file: Annotated[Path, typer.Argument(help="A YAML job spec.", show_default=False)],
) -> BorgmasterQuery[borgmaster_pb2.SubmitJobResponse]:
    """Validate a YAML job spec and submit it; errors name the line and the field."""
    try:
        text = read_text_file(file, "YAML", MAX_SPEC_BYTES)
    except TextFileError as error:
        errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    try:
        spec = job_spec_file.parse_job_spec(text)
    except job_spec_file.JobSpecError as error:
        errors.print(f"[red]error:[/red] {escape(f'{file}: {error}')}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    return BorgmasterQuery(lambda client: client.borgmaster.submit_job(spec), _print_submitted)


def _print_submitted(answer: borgmaster_pb2.SubmitJobResponse) -> None:
    state = enum_label(state_pb2.JobState, answer.state, "JOB_STATE_")
    console.print(
        f"submitted [bold]{answer.job_id}[/bold]: {state}, spec version {answer.spec_version}",
        highlight=False,
    )


@borgmaster_command(app, "list")
def list_jobs(
    user: Annotated[str, typer.Option(help="Only this user's jobs.")] = "",
    state: Annotated[
        list[str] | None, typer.Option(help=f"Only jobs in these states: {', '.join(STATES)}.")
    ] = None,
) -> BorgmasterQuery[list[state_pb2.JobStatus]]:
    """Every job (not its tasks), ordered by id."""
    request = borgmaster_pb2.ListJobsRequest(user=user)
    request.states.extend(state_filter(state, STATES))  # type: ignore[arg-type]
    return BorgmasterQuery(
        lambda client: client.borgmaster.list_jobs(request),
        lambda jobs: print_table(f"{len(jobs)} jobs", JOB_COLUMNS, jobs),
    )


JOB_COLUMNS: tuple[Column, ...] = (
    Column("job", lambda job: job.job_id, identifier=True),
    Column("state", lambda job: enum_label(state_pb2.JobState, job.state, "JOB_STATE_")),
    Column("priority", lambda job: str(job.spec.priority)),
    Column("tasks", lambda job: str(job.spec.task_count)),
    Column("pending", lambda job: str(job.task_counts.pending)),
    Column("running", lambda job: str(job.task_counts.running)),
    Column("cpu", lambda job: cores(job.spec.task.limits.cpu_millicores)),
    Column("memory", lambda job: gib(job.spec.task.limits.memory_bytes)),
    Column("autopilot", lambda job: autopilot_modes(job.spec.autopilot)),
)


@borgmaster_command(app)
def show(
    job: JobArgument,
) -> BorgmasterQuery[state_pb2.JobStatus]:
    """A job's spec, state and every task."""
    return BorgmasterQuery(
        lambda client: client.borgmaster.get_job(job_id(job), include_tasks=True).job,
        _print_job,
    )


TASK_COLUMNS: tuple[Column, ...] = (
    Column("task", lambda task: str(task.task_index), identifier=True),
    Column("state", lambda task: enum_label(state_pb2.TaskState, task.state, "TASK_STATE_")),
    Column("reason", lambda task: enum_label(state_pb2.TaskEventKind, task.reason, "TASK_EVENT_KIND_")),
    Column("machine", lambda task: task.machine_id or "-", identifier=True),
    Column("cpu used", lambda task: cores(task.usage.cpu_millicores)),
    Column("mem used", lambda task: gib(task.usage.memory_bytes)),
    Column("restarts", lambda task: str(task.restarts)),
    Column("next restart", lambda task: restart_backoff(task)),
    Column("detail", lambda task: task.reason_detail, prose=True),
)


def _print_job(status: state_pb2.JobStatus) -> None:
    spec, limits = status.spec, status.spec.task.limits
    console.print(
        f"[bold]{status.job_id}[/bold] {enum_label(state_pb2.JobState, status.state, 'JOB_STATE_')}, "
        f"spec version {status.spec_version}, priority {spec.priority}, {spec.task_count} tasks of "
        f"{cores(limits.cpu_millicores)} cores, {gib(limits.memory_bytes)}; "
        f"autopilot {autopilot_modes(spec.autopilot)}",
        highlight=False,
    )
    print_table(None, TASK_COLUMNS, status.tasks)
    for task in status.tasks:
        if task.last_failure:
            console.print(
                f"task {task.task_index}: {task.failures} failure(s) in a row, the last at "
                f"{at_time(task.last_failure_ms)}: {task.last_failure}",
                highlight=False,
            )


def at_time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000)) if ms else "-"


def restart_backoff(task: state_pb2.TaskStatus) -> str:
    """When a failed task may run again (Borg §4: crash loops back off), and machines it avoids."""
    if not task.failures:
        return "-"
    text = f"{task.failures} failure(s) in a row"
    if task.state == state_pb2.TASK_STATE_PENDING and task.next_restart_ms:
        text = f"{at_time(task.next_restart_ms)} ({task.failures} failure(s) in a row)"
    avoided = [a.machine_id for a in task.avoided_machines if a.until_ms > task.last_failure_ms]
    if avoided:
        text += f"; avoids {', '.join(avoided)}"
    return text


@app.command()
def kill(
    job: JobArgument,
    borgmaster: BorgmasterOption = DEFAULT_BORGMASTER,
    timeout: TimeoutOption = 10.0,
) -> None:
    """Kill every task of a job; the job becomes dead."""
    with connect(borgmaster, timeout_s=timeout) as client:
        answer = client.borgmaster.kill_job(job_id(job))
    console.print(f"killed {job} (log position {answer.log_sequence})", highlight=False)


@borgmaster_command(app)
def update(
    job: JobArgument,
    tasks: Annotated[int | None, typer.Option("--tasks", min=0, help="New task count.")] = None,
    cpu: Annotated[str | None, typer.Option(help="New per-task CPU limit: cores or 500m.")] = None,
    memory: Annotated[str | None, typer.Option(help="New per-task memory limit, e.g. 2Gi.")] = None,
    priority: Annotated[int | None, typer.Option(min=0, max=11, help="New priority, 0-11.")] = None,
    expected_version: Annotated[
        int, typer.Option(min=0, help="Refuse unless the job's spec version is this (0: any).")
    ] = 0,
    max_disruptions: Annotated[
        int, typer.Option(min=0, help="Most tasks the rolling update disrupts at once (0: no cap).")
    ] = 0,
) -> BorgmasterQuery[borgmaster_pb2.UpdateJobResponse]:
    """Change a job's task count, limits or priority (a rolling update, Borg §2.3)."""
    spec = job_pb2.JobSpec()
    paths: list[str] = []
    if tasks is not None:
        spec.task_count = tasks
        paths.append("task_count")
    if cpu is not None:
        spec.task.limits.cpu_millicores = quantity("--cpu", cpu, "cpu")
        paths.append("task.limits.cpu_millicores")
    if memory is not None:
        spec.task.limits.memory_bytes = quantity("--memory", memory, "memory")
        paths.append("task.limits.memory_bytes")
    if priority is not None:
        spec.priority = priority
        paths.append("priority")
    if not paths:
        raise typer.BadParameter("nothing to change: give --tasks, --cpu, --memory or --priority")
    return BorgmasterQuery(
        lambda client: client.borgmaster.update_job(
            job_id(job),
            spec,
            paths,
            expected_spec_version=expected_version,
            max_disruptions=max_disruptions,
        ),
        lambda answer: console.print(
            f"updated {answer.job.job_id} ({', '.join(paths)}): spec version {answer.job.spec_version}",
            highlight=False,
        ),
    )


@borgmaster_command(app, "why-pending")
def why_pending(
    job: JobArgument,
    task: Annotated[int | None, typer.Option(min=0, help="The task (default: its first pending).")] = None,
) -> BorgmasterQuery[borgmaster_pb2.WhyPendingResponse]:
    """What keeps a task from scheduling and the smallest change that would let it (Borg §2.6)."""
    return BorgmasterQuery(
        lambda client: client.borgmaster.why_pending(job_id(job), task),
        _print_why_pending,
    )


def _print_why_pending(answer: borgmaster_pb2.WhyPendingResponse) -> None:
    state = enum_label(state_pb2.TaskState, answer.task_state, "TASK_STATE_")
    console.print(f"[bold]{answer.job_id}/{answer.task_index}[/bold] is {state}", highlight=False)
    if answer.summary:
        console.print(answer.summary, highlight=False)
    if answer.lifetime.predicted:
        lifetime = answer.lifetime
        console.print(
            f"lifetime class {lifetime.class_name}: predicted {lifetime.remaining_s / 3600:.2f} h left",
            highlight=False,
        )
    if answer.task_state != state_pb2.TASK_STATE_PENDING:
        return
    console.print(f"feasible machines: {answer.machines_feasible} of {answer.machines_total} up")
    for exclusion in answer.constraint_exclusions:
        c = exclusion.constraint
        operator = enum_label(job_pb2.ConstraintOperator, c.operator, "CONSTRAINT_OPERATOR_")
        console.print(
            f"  constraint {c.attribute} {operator} {c.value}: "
            f"excludes {exclusion.machines_excluded} machines",
            highlight=False,
        )
    for resource in answer.resource_exclusions:
        name = enum_label(resources_pb2.Resource, resource.resource, "RESOURCE_")
        console.print(
            f"  not enough {name} on {resource.machines_excluded} machines "
            f"(most available: {format_amount(resource.resource, resource.max_available)})",
            highlight=False,
        )
    if answer.HasField("fitting_limits"):
        fit = answer.fitting_limits
        console.print(
            f"  would fit with limits cpu {cores(fit.cpu_millicores)} cores, memory {gib(fit.memory_bytes)}",
            highlight=False,
        )


def format_amount(resource: int, amount: int) -> str:
    if resource == resources_pb2.RESOURCE_CPU:
        return f"{cores(amount)} cores"
    if resource in (resources_pb2.RESOURCE_MEMORY, resources_pb2.RESOURCE_DISK):
        return gib(amount)
    return str(amount)
