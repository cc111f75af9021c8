"""A chaos run's figures: assembled from the checks, printed one per line, written as JSON.

Every figure prints as ``CHAOS <name> <value> <unit>``; a figure that is an invariant carries
what it must be and whether it held (the JSON file has both; the run's exit code is 1 when any
invariant failed).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cellpilot.chaos import invariants
from cellpilot.chaos.evidence import LoggedLogReset, StoreEvidence
from cellpilot.chaos.forger import Forgery
from cellpilot.chaos.plan import Fault
from cellpilot.chaos.stream_ledger import StreamLedger
from cellpilot.chaos.workload import PROBE_JOB, PoisonOutcome, TaskFailures


@dataclass(frozen=True)
class Figure:
    name: str
    value: float | int | None  # None: it never happened (e.g. no actuation within the bound)
    unit: str
    must_be: str = ""  # for an invariant: "0", "<= 45", ...
    held: bool | None = None  # None: a measurement, not an invariant
    note: str = ""

    def line(self) -> str:
        value = (
            "none"
            if self.value is None
            else f"{self.value:.1f}"
            if isinstance(self.value, float)
            else str(self.value)
        )
        return f"CHAOS {self.name} {value} {self.unit}"


def zero(name: str, value: int, unit: str, note: str = "") -> Figure:
    return Figure(name, value, unit, "0", value == 0, note)


@dataclass
class FaultRecord:
    """One fault as it was done, and what followed."""

    fault: Fault
    at: float = 0.0  # wall-clock seconds when it was injected
    target: str = ""  # e.g. "borgmaster[2]"
    restarted_after_s: float | None = None  # the killed process running again (supervisor)
    probe_edit_seq: int | None = None  # checkpoint-log position of the probe's re-inflation
    acknowledged_job: str | None = None  # the job submitted while the fault lasted, if acknowledged
    poison: PoisonOutcome | None = None
    forgery: Forgery | None = None
    error: str = ""


@dataclass
class RunFacts:
    """What the chaos run learnt besides the stores and the streams."""

    plan: str
    faults: list[FaultRecord]
    acknowledged: list[str]
    missing: list[str]
    submit_failures: list[str]
    machines: dict[str, int]
    poison_failures: dict[str, TaskFailures] = field(default_factory=dict)
    warm_up_s: float | None = None
    recovery_limit_s: float = 0.0
    wall_s: float = 0.0


def fault_figures(facts: RunFacts, evidence: StoreEvidence) -> list[Figure]:
    figures = []
    for record in facts.faults:
        name = record.fault.name
        if record.restarted_after_s is not None or record.fault.kind != "poison-jobs":
            figures.append(
                Figure(f"restarted_after.{name}", record.restarted_after_s, "s", note=record.target)
            )
        acted = (
            invariants.first_actuation_after(
                evidence.actuations, record.at, PROBE_JOB, record.probe_edit_seq or 0
            )
            if record.probe_edit_seq is not None
            else None
        )
        seconds = None if acted is None else max(0.0, acted.appended_at - record.at)
        bound = facts.recovery_limit_s
        figures.append(
            Figure(
                f"autopilot_acts_again.{name}",
                seconds,
                "s",
                f"<= {bound:.0f}",
                seconds is not None and seconds <= bound,
                "; ".join(filter(None, [f"to the first actuation on {PROBE_JOB} after it", record.error])),
            )
        )
        anything = invariants.first_actuation_after(evidence.actuations, record.at)
        figures.append(
            Figure(
                f"next_actuation.{name}",
                None if anything is None else max(0.0, anything.appended_at - record.at),
                "s",
                note="fault to the next actuation applied on any job",
            )
        )
    return figures


def job_figures(facts: RunFacts, evidence: StoreEvidence) -> list[Figure]:
    poison = next((r.poison for r in facts.faults if r.poison is not None), None)
    figures = [
        Figure("jobs_acknowledged", len(facts.acknowledged), "jobs"),
        Figure("jobs_acknowledged_present", len(facts.acknowledged) - len(facts.missing), "jobs"),
        zero("jobs_acknowledged_missing", len(facts.missing), "jobs", ", ".join(facts.missing)),
        Figure(
            "jobs_submit_failed", len(facts.submit_failures), "jobs", note="; ".join(facts.submit_failures)
        ),
        zero(
            "machines_marked_down",
            len(evidence.machines_down),
            "machines",
            "; ".join(f"{m.machine_id}: {m.detail}" for m in evidence.machines_down),
        ),
        Figure("machines_up_at_end", facts.machines.get("up", 0), "machines"),
    ]
    if poison is not None:
        figures += [
            Figure("poison_refused_invalid_argument", poison.refused_invalid_argument, "jobs", "1",
                   poison.refused_invalid_argument == 1, poison.refused_detail[:200]),
            zero("poison_admitted", poison.accepted_unknown_model, "jobs"),
        ]  # fmt: skip
    for label, failures in facts.poison_failures.items():
        figures.append(
            Figure(
                f"{label}_task_failures",
                failures.failures,
                "failures",
                ">= 1",
                failures.failures >= 1,
                f"{failures.state}, {failures.restarts} restarts; {failures.last_failure[:160]}",
            )
        )
    return figures


def pipeline_figures(
    ledger: StreamLedger,
    evidence: StoreEvidence,
    facts: RunFacts,
    resets: Sequence[LoggedLogReset],
) -> list[Figure]:
    windows = invariants.window_application(evidence)
    logged, seen = evidence.actuations, ledger.actuations  # as the Borgmaster applied / as published
    sets = ledger.recommendation_sets
    tokens = [a.fencing_token for a in evidence.actuations]
    highest_seen = max([*tokens, *(a.fencing_token for a in ledger.actuations), 0])
    broker_restarts = [r.at for r in facts.faults if r.fault.target == "kafka"]
    samples = invariants.account_samples(
        ledger, evidence, broker_restarts, [r for r in resets if r.service_log.startswith("aggregator")]
    )
    return [
        Figure("histogram_windows_published", windows.published, "windows"),
        Figure("windows_applied_by_recommenders", windows.applied, "windows"),
        zero("windows_double_applied", windows.double_applied, "windows",
             "recommender ML updates beyond the distinct job windows published"),
        Figure("windows_missed_by_recommenders", windows.missed, "windows",
               note="published, never folded in: lost with a broker log before a recommender read them"),
        zero("histogram_windows_conflicting", invariants.conflicting(ledger.histograms.values()), "windows",
             "a job window published twice with different content"),
        Figure("recommendation_sets_conflicting", invariants.conflicting(sets.values()), "sets",
               note="a (job, window) set published twice with different content (OOM reactions aside)"),
        Figure("actuations_applied", len(evidence.actuations), "actuations"),
        zero("actuations_applied_twice", invariants.applied_twice(evidence.actuations), "actuations"),
        Figure("actuations_replayed_noop", evidence.actuator_replays, "actuations",
               note="redelivered to the actuator and settled as DUPLICATE, not applied"),
        Figure("fencing_token_highest", highest_seen, "token"),
        zero("fencing_token_decreases", invariants.decreases(tokens), "actuations",
             "in the Borgmaster's log order, all jobs"),
        zero("fencing_token_decreases_per_job", invariants.decreases_per_job(logged), "actuations"),
        zero("fencing_token_decreases_on_topic", invariants.decreases_per_partition(seen), "actuations",
             "along each actuations partition log"),
        zero("fencing_tokens_with_two_masters", invariants.tokens_with_two_leaders(seen), "tokens"),
        zero("fencing_counter_behind", int(evidence.autopilot_fencing_counter < highest_seen), "counters",
             f"Redis counter {evidence.autopilot_fencing_counter}, highest token used {highest_seen}"),
        Figure("samples_published", samples.published, "samples",
               note=f"windows ending by {samples.through_ms}: every aggregator partition closed them"),
        Figure("samples_aggregated", samples.aggregated, "samples"),
        Figure("samples_late_dropped", samples.late, "samples"),
        Figure("samples_lost_with_broker_log", samples.lost_with_broker_log, "samples",
               note=f"{samples.lost_batches} batches beyond the aggregator's position when the broker died; "
               f"{samples.partitions_without_reset_warning} old partition logs without a warning"),
        Figure("samples_unexplained", samples.unexplained, "samples",
               note="published - aggregated - late - lost (negative: aggregated more than the reader saw)"),
        Figure("sample_batches_duplicate", samples.duplicate_batches, "batches"),
        Figure("broker_log_resets_logged", len(resets), "warnings",
               note="consumers' 'the log of ... is not the one applied' WARNINGs, all services"),
        Figure("broker_log_generations", 1 + max((r.generation for r in ledger.resets), default=0), "logs"),
    ]  # fmt: skip


def forgery_figures(ledger: StreamLedger, evidence: StoreEvidence, facts: RunFacts) -> list[Figure]:
    """What the forger's records did: nothing may have been applied, each must have been refused."""
    written = [w for r in facts.faults if r.forgery is not None for w in r.forgery.written]
    refused = Counter(r.reason or "undecodable" for r in ledger.refusals)
    figures = [
        Figure("records_refused", len(ledger.refusals), "records",
               note=", ".join(f"{reason} {n}" for reason, n in sorted(refused.items())) or "none"),
    ]  # fmt: skip
    if not written:
        return figures
    applied = invariants.forged_applied(evidence)
    unrefused = invariants.unrefused(written, ledger.refusals)
    return [
        *figures,
        Figure("forged_records_written", len(written), "records",
               note="; ".join(sorted({what for _, _, what in written}))),
        zero("forged_records_applied", applied.total, "records", applied.describe()),
        zero("forged_records_unrefused", len(unrefused), "records",
             "written, never filed on deadletter by a reader: " + "; ".join(unrefused)),
    ]  # fmt: skip


def all_figures(
    ledger: StreamLedger, evidence: StoreEvidence, facts: RunFacts, resets: Sequence[LoggedLogReset]
) -> list[Figure]:
    figures = [Figure("wall_time", facts.wall_s, "s"), Figure("warm_up", facts.warm_up_s, "s",
               note="submission to Autopilot's first right-sizing of the probe")]  # fmt: skip
    return (
        figures
        + job_figures(facts, evidence)
        + fault_figures(facts, evidence)
        + pipeline_figures(ledger, evidence, facts, resets)
        + forgery_figures(ledger, evidence, facts)
    )


def failed(figures: Sequence[Figure]) -> list[Figure]:
    return [f for f in figures if f.held is False]


def write_results(path: Path, facts: RunFacts, figures: Sequence[Figure]) -> None:
    document = {
        "plan": facts.plan,
        "wall_s": round(facts.wall_s, 1),
        "invariants_held": not failed(figures),
        "figures": {f.name: {k: v for k, v in asdict(f).items() if k != "name"} for f in figures},
        "faults": [
            {
                "name": r.fault.name,
                "what": r.fault.description,
                "target": r.target,
                "at": r.at,
                "acknowledged_job": r.acknowledged_job,
                "error": r.error,
            }
            for r in facts.faults
        ],
        "acknowledged_jobs": facts.acknowledged,
        "missing_jobs": facts.missing,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
