"""``cellpilot cell machines|quota|status``: machines, quotas (Borg §2.5, §5.5), CPU overflow (GPA §4).

cellpilot cell machines [--state up] [--json]
cellpilot cell quota [--user alice] [--json]
cellpilot cell status [--json]
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, machine_pb2
from cellpilot.cli.output import (
    DEFAULT_BORGMASTER,
    BorgmasterOption,
    JsonOption,
    TimeoutOption,
    connect,
    console,
    cores,
    enum_label,
    gib,
    print_json,
)

app = typer.Typer(help="The cell: machines, utilisation, quotas.", no_args_is_help=True)
MACHINE_STATES = {
    enum_label(machine_pb2.MachineState, v, "MACHINE_STATE_"): v
    for v in machine_pb2.MachineState.values()
    if v
}


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


@app.command()
def machines(
    state: Annotated[
        list[str] | None, typer.Option(help=f"Only machines in these states: {', '.join(MACHINE_STATES)}.")
    ] = None,
    rack: Annotated[str, typer.Option(help="Only this rack's machines.")] = "",
    borgmaster: BorgmasterOption = DEFAULT_BORGMASTER,
    as_json: JsonOption = False,
    timeout: TimeoutOption = 10.0,
) -> None:
    """Every machine: capacity, and usage vs reservation vs allocation (Borg §5.5)."""
    request = borgmaster_pb2.ListMachinesRequest(rack=rack)
    for name in state or []:
        if name not in MACHINE_STATES:
            raise typer.BadParameter(f"{name!r}; one of {', '.join(MACHINE_STATES)}", param_hint="--state")
        request.states.append(MACHINE_STATES[name])  # type: ignore[arg-type]
    with connect(borgmaster, timeout_s=timeout) as client:
        found: list[machine_pb2.Machine] = client.borgmaster.list_machines(request)
    if as_json:
        print_json(found)
        return
    table = Table(title=f"{len(found)} machines (shares of capacity: used / reserved / allocated)")
    for column in ("machine", "state", "rack", "tasks", "cores", "cpu u/r/a", "memory", "mem u/r/a"):
        table.add_column(column)
    for m in found:
        cap = m.spec.capacity
        table.add_row(
            m.spec.machine_id,
            enum_label(machine_pb2.MachineState, m.state, "MACHINE_STATE_"),
            m.spec.rack or "-",
            str(m.task_count),
            cores(cap.cpu_millicores),
            " / ".join(
                _share(r.cpu_millicores, cap.cpu_millicores) for r in (m.usage, m.reserved, m.allocated)
            ),
            gib(cap.memory_bytes),
            " / ".join(_share(r.memory_bytes, cap.memory_bytes) for r in (m.usage, m.reserved, m.allocated)),
        )
    console.print(table)


@app.command()
def quota(
    user: Annotated[str, typer.Option(help="Only this user's quotas.")] = "",
    borgmaster: BorgmasterOption = DEFAULT_BORGMASTER,
    as_json: JsonOption = False,
    timeout: TimeoutOption = 10.0,
) -> None:
    """Quota per user and priority band: the limit and what live jobs use of it (Borg §2.5)."""
    with connect(borgmaster, timeout_s=timeout) as client:
        answer: borgmaster_pb2.GetQuotaResponse = client.borgmaster.get_quota(user)
    if as_json:
        print_json(list(answer.quotas))
        return
    table = Table(title="quotas (used / limit)")
    for column in ("user", "band", "cpu cores", "memory"):
        table.add_column(column)
    for q in answer.quotas:
        table.add_row(
            q.user,
            enum_label(job_pb2.PriorityBand, q.band, "PRIORITY_BAND_"),
            f"{cores(q.used.cpu_millicores)} / {cores(q.limit.cpu_millicores)}",
            f"{gib(q.used.memory_bytes)} / {gib(q.limit.memory_bytes)}",
        )
    console.print(table)


@app.command()
def status(
    borgmaster: BorgmasterOption = DEFAULT_BORGMASTER,
    as_json: JsonOption = False,
    timeout: TimeoutOption = 10.0,
) -> None:
    """The GPA fit test's overflow probability rho next to the CPU overflow the polls observed."""
    with connect(borgmaster, timeout_s=timeout) as client:
        answer: borgmaster_pb2.GetCellStatusResponse = client.borgmaster.get_cell_status()
    if as_json:
        print_json(answer)
        return
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
