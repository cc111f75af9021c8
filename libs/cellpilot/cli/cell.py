"""``cellpilot cell ...``: machines, quotas (Borg §2.5, §5.5), CPU overflow (GPA §4), lifetimes (LAVA).

cellpilot cell machines [--state up] [--json]
cellpilot cell quota [--user alice] [--json]
cellpilot cell status [--json]
cellpilot cell train-lifetimes [--min-runs 50] [--json]
cellpilot cell lifetimes [--json]
cellpilot cell drain MACHINE [--detail why] [--json]
"""

from __future__ import annotations

from typing import Annotated

import typer

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, lifetimes_pb2, machine_pb2, resources_pb2, state_pb2
from cellpilot.cli.job import quantity
from cellpilot.cli.output import (
    BorgmasterQuery,
    Column,
    borgmaster_command,
    console,
    print_table,
    state_filter,
)
from cellpilot.client import SyncCellpilotClient
from cellpilot.client.wording import cores, enum_label, gib

app = typer.Typer(help="The cell: machines, utilisation, quotas.", no_args_is_help=True)
MACHINE_STATES = {
    enum_label(machine_pb2.MachineState, v, "MACHINE_STATE_"): v
    for v in machine_pb2.MachineState.values()
    if v
}


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


@borgmaster_command(app)
def machines(
    state: Annotated[
        list[str] | None, typer.Option(help=f"Only machines in these states: {', '.join(MACHINE_STATES)}.")
    ] = None,
    rack: Annotated[str, typer.Option(help="Only this rack's machines.")] = "",
) -> BorgmasterQuery[list[machine_pb2.Machine]]:
    """Every machine: capacity, and usage vs reservation vs allocation (Borg §5.5)."""
    request = borgmaster_pb2.ListMachinesRequest(rack=rack)
    request.states.extend(state_filter(state, MACHINE_STATES))  # type: ignore[arg-type]
    return BorgmasterQuery(
        lambda client: client.borgmaster.list_machines(request),
        lambda found: print_table(
            f"{len(found)} machines (shares of capacity: used / reserved / allocated)", MACHINE_COLUMNS, found
        ),
    )


def _shares(m: machine_pb2.Machine, resource: str) -> str:
    """Used / reserved / allocated, each as a share of the machine's capacity of ``resource``."""
    whole = getattr(m.spec.capacity, resource)
    return " / ".join(_share(getattr(r, resource), whole) for r in (m.usage, m.reserved, m.allocated))


MACHINE_COLUMNS: tuple[Column, ...] = (
    Column("machine", lambda m: m.spec.machine_id, identifier=True),
    Column("state", lambda m: enum_label(machine_pb2.MachineState, m.state, "MACHINE_STATE_")),
    Column("rack", lambda m: m.spec.rack or "-"),
    Column("tasks", lambda m: str(m.task_count)),
    Column("cores", lambda m: cores(m.spec.capacity.cpu_millicores)),
    Column("cpu u/r/a", lambda m: _shares(m, "cpu_millicores")),
    Column("memory", lambda m: gib(m.spec.capacity.memory_bytes)),
    Column("mem u/r/a", lambda m: _shares(m, "memory_bytes")),
)


@borgmaster_command(app)
def quota(
    user: Annotated[str, typer.Option(help="Only this user's quotas.")] = "",
) -> BorgmasterQuery[list[state_pb2.Quota]]:
    """Quota per user and priority band: the limit and what live jobs use of it (Borg §2.5)."""
    return BorgmasterQuery(
        lambda client: list(client.borgmaster.get_quota(user).quotas),
        lambda quotas: print_table("quotas (used / limit)", QUOTA_COLUMNS, quotas),
    )


QUOTA_COLUMNS: tuple[Column, ...] = (
    Column("user", lambda q: q.user, identifier=True),
    Column("band", lambda q: enum_label(job_pb2.PriorityBand, q.band, "PRIORITY_BAND_"), identifier=True),
    Column("cpu cores", lambda q: f"{cores(q.used.cpu_millicores)} / {cores(q.limit.cpu_millicores)}"),
    Column("memory", lambda q: f"{gib(q.used.memory_bytes)} / {gib(q.limit.memory_bytes)}"),
)


BANDS = {enum_label(job_pb2.PriorityBand, v, "PRIORITY_BAND_"): v for v in job_pb2.PriorityBand.values() if v}


@borgmaster_command(app, "set-quota")
def set_quota(
    user: Annotated[str, typer.Argument(help="The user whose quota is set.", show_default=False)],
    band: Annotated[str, typer.Option(help=f"Priority band: {', '.join(BANDS)}.")] = "production",
    cpu: Annotated[str | None, typer.Option(help="CPU: cores or millicores, e.g. 16 or 500m.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory, e.g. 64Gi.")] = None,
    disk: Annotated[str | None, typer.Option(help="Local disk, e.g. 1Ti.")] = None,
    ports: Annotated[int | None, typer.Option(min=0, help="Network ports.")] = None,
) -> BorgmasterQuery[borgmaster_pb2.SetQuotaResponse]:
    """Set a user's quota in one priority band (Borg §2.5; needs an admin token). A resource not
    given keeps its current limit (0 for a new quota). Live jobs keep running even if they are now
    over it; the quota is checked at admission."""
    if band not in BANDS:
        raise typer.BadParameter(f"{band!r} is not one of {', '.join(BANDS)}", param_hint="--band")
    if cpu is None and memory is None and disk is None and ports is None:
        raise typer.BadParameter("nothing to set: give --cpu, --memory, --disk or --ports")

    def set_limit(client: SyncCellpilotClient) -> borgmaster_pb2.SetQuotaResponse:
        current = next(
            (
                q.limit
                for q in client.borgmaster.get_quota(user).quotas
                if q.user == user and q.band == BANDS[band]
            ),
            resources_pb2.Resources(),
        )
        limit = resources_pb2.Resources(
            cpu_millicores=current.cpu_millicores if cpu is None else quantity("--cpu", cpu, "cpu"),
            memory_bytes=current.memory_bytes if memory is None else quantity("--memory", memory, "memory"),
            disk_bytes=current.disk_bytes if disk is None else quantity("--disk", disk, "memory"),
            ports=current.ports if ports is None else ports,
        )
        request = borgmaster_pb2.SetQuotaRequest(user=user, band=BANDS[band], limit=limit)
        return client.borgmaster.set_quota(request)

    return BorgmasterQuery(set_limit, lambda answer: _print_quota(answer.quota, band))


def _print_quota(q: state_pb2.Quota, band: str) -> None:
    console.print(
        f"quota of {q.user} in {band}: {cores(q.limit.cpu_millicores)} cores, {gib(q.limit.memory_bytes)}, "
        f"{gib(q.limit.disk_bytes)} disk, {q.limit.ports} ports "
        f"(in use {cores(q.used.cpu_millicores)} cores, {gib(q.used.memory_bytes)})",
        highlight=False,
    )


@borgmaster_command(app)
def status() -> BorgmasterQuery[borgmaster_pb2.GetCellStatusResponse]:
    """The master's view of the cell: the GPA fit test's rho next to the CPU overflow the polls
    observed, and the scheduler's proposals it accepted and refused as stale (Borg §3.4)."""
    return BorgmasterQuery(lambda client: client.borgmaster.get_cell_status(), _print_status)


def _print_status(answer: borgmaster_pb2.GetCellStatusResponse) -> None:
    fit = f"GPA, rho {answer.gpa_rho:g}" if answer.gpa_rho > 0 else "CPU limits (GPA off)"
    overall = f"{answer.overflowed_samples / answer.machine_samples:.4f}" if answer.machine_samples else "-"
    role = "master" if answer.is_leader else "follower (no master known; it does not poll)"
    console.print(
        f"{role} {answer.replica_id}: non-prod CPU fit by {fit}; {answer.tasks_running} tasks running "
        f"on {answer.machines_in_use} machines, {answer.tasks_with_cpu_stats} with learned CPU moments\n"
        f"CPU overflow (machine demand > capacity): {answer.recent_overflow_rate:.4f} of the last "
        f"{answer.recent_samples} machine samples; {answer.overflowed_samples} of {answer.machine_samples} "
        f"(= {overall}) since it took over",
        highlight=False,
    )
    proposed = answer.placements_accepted + answer.placements_stale
    stale = f"{answer.placements_stale / proposed:.1%}" if proposed else "-"
    console.print(
        f"log position {answer.log_sequence}; {answer.tasks_pending} tasks pending; the scheduler's "
        f"proposals since it took over: {answer.proposals} batches, {answer.placements_accepted} placements "
        f"accepted, {answer.placements_stale} refused as stale ({stale}), "
        f"{answer.placements_preempted} tasks preempted",
        highlight=False,
    )
    for reason, count in sorted(answer.stale_reasons.items(), key=lambda item: -item[1]):
        console.print(f"  stale: {count} {reason}", highlight=False)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.1f} s"


def _lifetime(lifetime: lifetimes_pb2.TaskLifetime) -> str:
    if not lifetime.predicted:
        return "no prediction"
    return f"{lifetime.class_name}, {_hours(lifetime.remaining_s)} left"


@borgmaster_command(app, "train-lifetimes", timeout_s=300.0)
def train_lifetimes(
    min_runs: Annotated[
        int, typer.Option(min=0, help="Fewest finished task runs to train on (0: default).")
    ] = 0,
) -> BorgmasterQuery[lifetimes_pb2.TrainLifetimesResponse]:
    """Trains the cell's lifetime model on its own history (LAVA §3) for LAS / LAVA / LARS."""
    return BorgmasterQuery(
        lambda client: client.borgmaster.train_lifetimes(min_runs),
        _print_trained,
    )


def _print_trained(answer: lifetimes_pb2.TrainLifetimesResponse) -> None:
    classes = ", ".join(f"LC{i + 1} {n}" for i, n in enumerate(answer.runs_per_class))
    console.print(
        f"trained on {answer.runs} finished task runs of {answer.jobs} jobs (median lifetime "
        f"{_hours(answer.median_lifetime_s)}; {classes}); recorded at log position "
        f"{answer.log_sequence} ({answer.model_bytes} bytes)",
        highlight=False,
    )


@borgmaster_command(app)
def lifetimes() -> BorgmasterQuery[lifetimes_pb2.GetLifetimesResponse]:
    """The placement policy, the lifetime model and LAVA's host states (§4.3)."""
    return BorgmasterQuery(lambda client: client.borgmaster.get_lifetimes(), _print_lifetimes)


LAVA_HOST_COLUMNS: tuple[Column, ...] = (
    Column("machine", lambda host: host.machine_id, identifier=True),
    Column("state", lambda host: enum_label(lifetimes_pb2.LavaHostState, host.state, "LAVA_HOST_STATE_")),
    Column("class", lambda host: f"LC{host.lifetime_class}"),
    Column("deadline (ms)", lambda host: str(host.deadline_ms)),
    Column("residual tasks", lambda host: str(len(host.residual))),
)


def _print_lifetimes(answer: lifetimes_pb2.GetLifetimesResponse) -> None:
    model = f"model trained on {answer.model_runs} runs" if answer.model_loaded else "no lifetime model"
    console.print(f"placement policy {answer.placement_policy}; {model}", highlight=False)
    title = f"{len(answer.hosts)} machines with a LAVA lifetime class"
    print_table(title, LAVA_HOST_COLUMNS, answer.hosts)


@borgmaster_command(app)
def drain(
    machine: Annotated[str, typer.Argument(help="The machine to drain.")],
    detail: Annotated[str, typer.Option(help="Why (kept with the machine's state).")] = "",
) -> BorgmasterQuery[lifetimes_pb2.DrainMachineResponse]:
    """Drains a machine: its tasks move elsewhere, longest predicted lifetime first (LARS, LAVA §4.4)."""
    return BorgmasterQuery(
        lambda client: client.borgmaster.drain_machine(machine, detail),
        _print_drain,
    )


def _print_drain(answer: lifetimes_pb2.DrainMachineResponse) -> None:
    console.print(
        f"draining {answer.machine_id}: {len(answer.moves)} tasks move, {answer.reason}", highlight=False
    )
    for move in answer.moves:
        console.print(
            f"  {move.rank}. {move.task.job_id}/{move.task.task_index}: {_lifetime(move.lifetime)}",
            highlight=False,
        )
