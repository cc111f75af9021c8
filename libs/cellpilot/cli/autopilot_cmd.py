"""``cellpilot autopilot show|config``: what Autopilot recommends for a job, and its settings.

    cellpilot autopilot show alice/web [--json]
    cellpilot autopilot config alice/web --opt-in                      # CPU and memory ON
    cellpilot autopilot config alice/web --dry-run --resource memory   # recommend, never apply
    cellpilot autopilot config alice/web --bounds cpu=100m:4 --bounds memory=256Mi:8Gi \\
        --bounds tasks=1:20 --recommender cpu=ml

Autopilot §3.1: jobs opt in per resource; dry-run jobs get recommendations that are shown
but never actuated (§5); users bound the limits and may override the recommender.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

import typer

from cellpilot.api.v1 import autopilot_pb2, job_pb2, recommendation_pb2, resources_pb2
from cellpilot.cli.job import job_id, quantity
from cellpilot.cli.output import (
    DEFAULT_AUTOPILOT,
    DEFAULT_BORGMASTER,
    AutopilotOption,
    BorgmasterOption,
    Column,
    JsonOption,
    OutputOption,
    TimeoutOption,
    connect,
    console,
    errors,
    message_dict,
    print_answer,
    print_json,
    print_table,
    register_with_options,
    shared_option,
    use_output,
)
from cellpilot.client import SyncCellpilotClient, UnavailableError
from cellpilot.client.job_spec_file import RECOMMENDERS
from cellpilot.client.wording import amount, cores, enum_label, gib, recommender_name, why

app = typer.Typer(
    help="Autopilot's recommendations and per-job settings (Autopilot §3).", no_args_is_help=True
)

JobArgument = Annotated[str, typer.Argument(help="The job, <user>/<name>.", show_default=False)]
RESOURCES = ("cpu", "memory", "tasks")
T = TypeVar("T")


def _print_recommendations(job: str, recs: autopilot_pb2.JobRecommendations) -> None:
    held = " [yellow](held until its first recommendation)[/yellow]" if recs.held else ""
    console.print(f"[bold]{job}[/bold]{held}", highlight=False)
    for decision in recs.vertical:
        resource = enum_label(resources_pb2.Resource, decision.resource, "RESOURCE_")
        mode = _mode_label(decision.mode)
        title = f"{resource}: mode {mode}, limit now {amount(decision.resource, decision.current_limit)}"
        print_table(title, _candidate_columns(decision), decision.candidates)
        chosen = decision.chosen
        if chosen.recommendation_id:
            console.print(
                f"  chosen: {recommender_name(decision.selected)} -> "
                f"{amount(decision.resource, chosen.value)} ({why(chosen) or 'no explanation'})",
                highlight=False,
            )
        else:
            console.print("  no recommendation yet (waiting for usage history)")
    if recs.HasField("horizontal"):
        h = recs.horizontal
        mode = _mode_label(h.mode)
        stabiliser = enum_label(recommendation_pb2.Stabiliser, h.chosen.stabiliser, "STABILISER_")
        console.print(
            f"tasks: mode {mode}, now {h.current_task_count}, recommended {h.chosen.task_count} "
            f"(raw {h.chosen.raw_task_count:.2f}, decided by {stabiliser})",
            highlight=False,
        )


def _candidate_columns(decision: autopilot_pb2.VerticalDecision) -> tuple[Column, ...]:
    def value(of: Callable[[recommendation_pb2.Recommendation], int]) -> Callable[[Any], str]:
        return lambda candidate: amount(decision.resource, of(candidate))

    return (
        Column("recommender", lambda candidate: recommender_name(candidate.recommender), identifier=True),
        Column("value", value(lambda candidate: candidate.value)),
        Column(
            "",
            lambda candidate: "[green]selected[/green]" if candidate.recommender == decision.selected else "",
        ),
        Column("why", why, prose=True),
        Column("raw", value(lambda candidate: candidate.raw_value)),
        Column("margin", value(lambda candidate: candidate.margin)),
    )


@dataclass(frozen=True)
class AutopilotQuery(Generic[T]):
    """What an Autopilot command asks (``call``), how it prints the answer without ``--json``, and
    what it does with the Borgmaster alone when Autopilot is unreachable (given ``--json``)."""

    call: Callable[[SyncCellpilotClient], T]
    show: Callable[[T], None]
    without_autopilot: Callable[[SyncCellpilotClient, UnavailableError, bool], None]


def _ask_autopilot(
    bound: Callable[[], AutopilotQuery[Any]],
    autopilot: str,
    borgmaster: str,
    as_json: bool,
    output: str,
    timeout: float,
) -> None:
    as_json = use_output(output, as_json)
    asked = bound()
    with connect(borgmaster, autopilot, timeout_s=timeout) as client:
        try:
            answer = asked.call(client)
        except UnavailableError as error:
            asked.without_autopilot(client, error, as_json)
            return
    print_answer(answer, as_json, asked.show)


_AUTOPILOT_OPTIONS = (
    shared_option("autopilot", AutopilotOption, DEFAULT_AUTOPILOT),
    shared_option("borgmaster", BorgmasterOption, DEFAULT_BORGMASTER),
    shared_option("as_json", JsonOption, False),
    shared_option("output", OutputOption, ""),
    shared_option("timeout", TimeoutOption, 5.0),
)


def _autopilot_command(query: Callable[..., AutopilotQuery[Any]]) -> Callable[..., AutopilotQuery[Any]]:
    """Registers a command that asks Autopilot once (``--autopilot``, ``--borgmaster``, ``--json``,
    ``-o``, ``--timeout`` after its own options)."""
    register_with_options(app, None, query, _AUTOPILOT_OPTIONS, _ask_autopilot)
    return query


@_autopilot_command
def show(job: JobArgument) -> AutopilotQuery[autopilot_pb2.JobRecommendations]:
    """Current limits, every recommender's value, the chosen one and why."""
    job = job_id(job)
    return AutopilotQuery(
        lambda client: client.autopilot.get_recommendation(job, include_candidates=True).recommendations,
        lambda recommendations: _print_recommendations(job, recommendations),
        lambda client, error, as_json: _show_without_autopilot(client, job, as_json, error),
    )


def _show_without_autopilot(
    client: SyncCellpilotClient, job: str, as_json: bool, error: UnavailableError
) -> None:
    """Autopilot is down: show what the Borgmaster knows, and say so."""
    errors.print(f"[yellow]warning:[/yellow] Autopilot is not reachable ({error.details})", highlight=False)
    status = client.borgmaster.get_job(job).job
    limits = status.spec.task.limits
    if as_json:
        print_json(
            {
                "job_id": job,
                "autopilot_available": False,
                "limits": message_dict(limits),
                "task_count": status.spec.task_count,
                "autopilot": message_dict(status.spec.autopilot),
            }
        )
        return
    console.print(
        f"[bold]{job}[/bold]: limits now {cores(limits.cpu_millicores)} cores, {gib(limits.memory_bytes)}, "
        f"{status.spec.task_count} tasks; no recommendations while Autopilot is down",
        highlight=False,
    )


def _mode(opt_in: bool, dry_run: bool, off: bool) -> Any:
    chosen = [m for m, on in ((job_pb2.SCALING_MODE_ON, opt_in), (job_pb2.SCALING_MODE_DRY_RUN, dry_run),
                              (job_pb2.SCALING_MODE_OFF, off)) if on]  # fmt: skip
    if len(chosen) > 1:
        raise typer.BadParameter("give only one of --opt-in, --dry-run, --off")
    return chosen[0] if chosen else None


def _pairs(values: list[str], option: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        resource, sep, rest = value.partition("=")
        if not sep or resource not in RESOURCES:
            raise typer.BadParameter(
                f"{value!r}: expected RESOURCE=..., RESOURCE one of {RESOURCES}", param_hint=option
            )
        pairs.append((resource, rest))
    return pairs


def apply_options(
    config: job_pb2.AutopilotConfig,
    resources: list[str],
    mode: Any,
    bounds: list[str],
    recommenders: list[str],
    target_utilization: float | None,
) -> job_pb2.AutopilotConfig:
    """The config after the command's options; options are validated with the option named."""
    config = job_pb2.AutopilotConfig.FromString(config.SerializeToString())
    for resource in resources:
        if resource not in RESOURCES:
            raise typer.BadParameter(f"{resource!r}; one of {', '.join(RESOURCES)}", param_hint="--resource")
    if mode is not None:
        for resource in resources:
            section = config.horizontal if resource == "tasks" else getattr(config, resource)
            section.mode = mode
    for resource, text in _pairs(bounds, "--bounds"):
        low, sep, high = text.partition(":")
        if not sep:
            raise typer.BadParameter(
                f"{resource}={text!r}: expected MIN:MAX (either may be empty)", param_hint="--bounds"
            )
        if resource == "tasks":
            try:
                config.horizontal.min_tasks = int(low) if low else 0
                config.horizontal.max_tasks = int(high) if high else 0
            except ValueError:
                raise typer.BadParameter(
                    f"tasks={text!r}: task counts are whole numbers", param_hint="--bounds"
                ) from None
            low_value, high_value = config.horizontal.min_tasks, config.horizontal.max_tasks
        else:
            section = getattr(config, resource)
            section.min_limit = quantity("--bounds", low, resource) if low else 0
            section.max_limit = quantity("--bounds", high, resource) if high else 0
            low_value, high_value = section.min_limit, section.max_limit
        if high_value and low_value > high_value:
            raise typer.BadParameter(
                f"{resource}={text!r}: the minimum is above the maximum", param_hint="--bounds"
            )
    for resource, name in _pairs(recommenders, "--recommender"):
        if resource == "tasks":
            raise typer.BadParameter("the task count has no recommender choice", param_hint="--recommender")
        ref = getattr(config, resource).recommender
        if name.startswith("custom:"):
            ref.kind, ref.custom_name = job_pb2.RECOMMENDER_KIND_CUSTOM, name.removeprefix("custom:")
        elif name in RECOMMENDERS and name != "custom":
            ref.kind, ref.custom_name = RECOMMENDERS[name], ""  # type: ignore[assignment]
        else:
            known = ", ".join([*RECOMMENDERS, "custom:<name>"])
            raise typer.BadParameter(f"{name!r}; one of {known}", param_hint="--recommender")
    if target_utilization is not None:
        config.horizontal.target_utilization = target_utilization
    return config


@_autopilot_command
def config(
    job: JobArgument,
    opt_in: Annotated[bool, typer.Option("--opt-in", help="Let Autopilot change the resources.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Recommend but never apply.")] = False,
    off: Annotated[bool, typer.Option("--off", help="Turn Autopilot off for the resources.")] = False,
    resource: Annotated[
        list[str] | None, typer.Option("--resource", help="cpu, memory, tasks (default: cpu and memory).")
    ] = None,
    bounds: Annotated[
        list[str] | None,
        typer.Option("--bounds", help="RESOURCE=MIN:MAX, e.g. cpu=100m:4, memory=256Mi:8Gi, tasks=1:20."),
    ] = None,
    recommender: Annotated[
        list[str] | None,
        typer.Option("--recommender", help="RESOURCE=NAME, e.g. cpu=ml, memory=moving-window-max."),
    ] = None,
    target_utilization: Annotated[
        float | None, typer.Option(min=0.01, max=1.0, help="Horizontal: target CPU use per task, (0, 1].")
    ] = None,
) -> AutopilotQuery[autopilot_pb2.SetAutopilotConfigResponse]:
    """Opt a job in or out, switch it to dry-run, bound its limits or pick its recommender."""
    job = job_id(job)
    mode = _mode(opt_in, dry_run, off)
    resources = resource or ["cpu", "memory"]

    def store(client: SyncCellpilotClient) -> autopilot_pb2.SetAutopilotConfigResponse:
        current = client.autopilot.get_config(job).config
        wanted = apply_options(current, resources, mode, bounds or [], recommender or [], target_utilization)
        return client.autopilot.set_config(job, wanted)

    return AutopilotQuery(
        store,
        lambda answer: _print_stored(job, answer.spec_version, answer.effective),
        lambda client, error, _: _config_at_borgmaster(
            client, job, resources, mode, bounds, recommender, target_utilization, error
        ),
    )


def _print_stored(job: str, spec_version: int, config: job_pb2.AutopilotConfig) -> None:
    console.print(f"{job}: Autopilot config stored (spec version {spec_version})", highlight=False)
    _print_config(config)


def _config_at_borgmaster(
    client: SyncCellpilotClient,
    job: str,
    resources: list[str],
    mode: Any,
    bounds: list[str] | None,
    recommenders: list[str] | None,
    target_utilization: float | None,
    error: UnavailableError,
) -> None:
    """Autopilot is down: store the config in the job's spec directly; it applies when Autopilot runs."""
    errors.print(
        f"[yellow]warning:[/yellow] Autopilot is not reachable ({error.details}); storing the config in "
        "the job's spec at the Borgmaster, where Autopilot reads it when it runs",
        highlight=False,
    )
    current = client.borgmaster.get_job(job).job.spec.autopilot
    wanted = apply_options(current, resources, mode, bounds or [], recommenders or [], target_utilization)
    answer = client.borgmaster.update_job(job, job_pb2.JobSpec(autopilot=wanted), ["autopilot"])
    _print_stored(job, answer.job.spec_version, answer.job.spec.autopilot)


def _mode_label(mode: int) -> str:
    return enum_label(job_pb2.ScalingMode, mode or job_pb2.SCALING_MODE_OFF, "SCALING_MODE_")


def _print_config(config: job_pb2.AutopilotConfig) -> None:
    for name in ("cpu", "memory"):
        section: job_pb2.VerticalScalingConfig = getattr(config, name)
        resource = resources_pb2.RESOURCE_CPU if name == "cpu" else resources_pb2.RESOURCE_MEMORY
        low, high = (amount(resource, v) if v else "-" for v in (section.min_limit, section.max_limit))
        console.print(
            f"  {name}: {_mode_label(section.mode)}, bounds {low}..{high}, "
            f"recommender {recommender_name(section.recommender)}",
            highlight=False,
        )
    h = config.horizontal
    console.print(
        f"  tasks: {_mode_label(h.mode)}, bounds {h.min_tasks or 1}..{h.max_tasks or '-'}, "
        f"target utilization {h.target_utilization:g}",
        highlight=False,
    )
