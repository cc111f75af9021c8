"""The memory limit kind the Borglets enforce (Autopilot §4.1: Autopilot-managed memory is soft)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cellpilot.api.v1 import job_pb2
from cellpilot.borg.lifecycle import JobState
from cellpilot.borg.model import AutopilotConfig, JobSpec, TaskSpec, VerticalScaling
from cellpilot.borg.records import JobRecord, TaskRecord
from cellpilot.borg_wire.borglet_polls import desired_out
from cellpilot.borg_wire.specs import job_spec_out
from cellpilot.job_vocabulary import MemoryLimitKind, ScalingMode
from cellpilot.schedule import Resources
from cellpilot.units import GIB


def job_spec(autopilot: AutopilotConfig) -> JobSpec:
    limits = Resources(cpu=1000, ram=GIB)
    return JobSpec(name="web", user="alice", priority=9, task=TaskSpec(limits=limits), autopilot=autopilot)


ON = AutopilotConfig(memory=VerticalScaling(mode=ScalingMode.ON))


@pytest.mark.parametrize(
    ("autopilot", "kind", "effective"),
    [
        (AutopilotConfig(), MemoryLimitKind.UNSPECIFIED, MemoryLimitKind.HARD),
        (ON, MemoryLimitKind.UNSPECIFIED, MemoryLimitKind.SOFT),
        (ON, MemoryLimitKind.HARD, MemoryLimitKind.HARD),  # the user keeps a hard limit
        (
            AutopilotConfig(memory=VerticalScaling(mode=ScalingMode.DRY_RUN)),
            MemoryLimitKind.UNSPECIFIED,
            MemoryLimitKind.HARD,
        ),
        (
            AutopilotConfig(cpu=VerticalScaling(mode=ScalingMode.ON)),
            MemoryLimitKind.UNSPECIFIED,
            MemoryLimitKind.HARD,
        ),
        (AutopilotConfig(), MemoryLimitKind.SOFT, MemoryLimitKind.SOFT),
    ],
)
def test_autopilot_managed_memory_is_soft_unless_the_user_keeps_it_hard(
    autopilot: AutopilotConfig, kind: MemoryLimitKind, effective: MemoryLimitKind
) -> None:
    spec = job_spec(autopilot=autopilot)
    spec = replace(spec, task=replace(spec.task, memory_limit_kind=kind))
    assert spec.effective_memory_limit_kind is effective


def test_the_borglet_is_told_the_effective_kind_and_the_spec_keeps_what_the_user_wrote() -> None:
    spec = job_spec(autopilot=ON)
    job = JobRecord(spec=spec, spec_version=1, state=JobState.RUNNING, submitted_ms=0, state_since_ms=0)
    task = TaskRecord(job_id=spec.job_id, index=0, limits=spec.task.limits, spec_version=1)
    desired = desired_out(1, [(job, task)])
    assert desired.tasks[0].spec.memory_limit_kind == job_pb2.MEMORY_LIMIT_KIND_SOFT
    assert job_spec_out(spec).task.memory_limit_kind == job_pb2.MEMORY_LIMIT_KIND_UNSPECIFIED
