"""An ``Actuation`` as the Borgmaster ``UpdateJob`` arguments, and refusals as outcomes."""

from __future__ import annotations

from cellpilot.api.v1 import actuation_pb2, job_pb2, resources_pb2
from cellpilot.client.errors import CellpilotError, ConflictError, UnavailableError
from cellpilot.platform.error_reasons import FENCED, NOT_MASTER, STALE_SPEC_VERSION

CPU_PATH = "task.limits.cpu_millicores"
MEMORY_PATH = "task.limits.memory_bytes"
TASKS_PATH = "task_count"


def update_of(actuation: actuation_pb2.Actuation) -> tuple[job_pb2.JobSpec, list[str]]:
    """The partial spec and update mask; an empty mask with ``release_hold`` lifts the hold only."""
    limits = resources_pb2.Resources()
    paths = []
    if actuation.HasField("cpu_limit_millicores"):
        limits.cpu_millicores = actuation.cpu_limit_millicores
        paths.append(CPU_PATH)
    if actuation.HasField("memory_limit_bytes"):
        limits.memory_bytes = actuation.memory_limit_bytes
        paths.append(MEMORY_PATH)
    spec = job_pb2.JobSpec(task=job_pb2.TaskSpec(limits=limits))
    if actuation.HasField("task_count"):
        spec.task_count = actuation.task_count
        paths.append(TASKS_PATH)
    return spec, paths


def invalid_reason(actuation: actuation_pb2.Actuation) -> str:
    """Why the actuator refuses to even try (empty = fine)."""
    if not actuation.idempotency_key:
        return "idempotency_key: required"
    if not actuation.job_id:
        return "job_id: required"
    if actuation.fencing_token <= 0:
        return "fencing_token: must be > 0 (actuations come from an elected master)"
    _, paths = update_of(actuation)
    if not paths and not actuation.release_hold:
        return "nothing to change"
    return ""


def is_transient(error: CellpilotError) -> bool:
    """Worth retrying: no master reachable, or a follower that does not know the master yet."""
    return isinstance(error, UnavailableError) or error.reason == NOT_MASTER


# A Borgmaster refusal (FAILED_PRECONDITION) as an outcome, by the reason it gives.
REFUSALS = {
    FENCED: actuation_pb2.ACTUATION_OUTCOME_FENCED,
    STALE_SPEC_VERSION: actuation_pb2.ACTUATION_OUTCOME_CONFLICT,
}


def refusal_outcome(error: CellpilotError) -> actuation_pb2.ActuationOutcome.ValueType:
    """What a refused update settles as: FENCED (a deposed master's token), CONFLICT (the job
    moved on from the spec version the decision was based on), else INVALID."""
    if isinstance(error, ConflictError):
        return REFUSALS.get(error.reason, actuation_pb2.ACTUATION_OUTCOME_INVALID)
    return actuation_pb2.ACTUATION_OUTCOME_INVALID
