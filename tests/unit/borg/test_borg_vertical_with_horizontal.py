"""Vertical CPU and CPU-utilisation horizontal scaling on one job: admitted only when they converge.

Utilisation measured against a limit Autopilot keeps changing feeds the vertical loop back into
the task count (Autopilot §3.3's n_r = r_S / r* with r* a share of a moving limit): such a spec
is refused at the door with the field named; with a fixed per-task reference size it is admitted.
"""

from __future__ import annotations

from dataclasses import replace

from borg_builders import job_spec

from cellpilot.borg.model import AutopilotConfig, HorizontalScaling, JobSpec, VerticalScaling
from cellpilot.borg.validation import validate_job_spec
from cellpilot.job_vocabulary import HorizontalSource, ScalingMode

FIELD = "spec.autopilot.horizontal.reference_cpu_millicores"


def _spec(
    cpu: ScalingMode, reference: int = 0, source: HorizontalSource = HorizontalSource.CPU_UTILIZATION
) -> JobSpec:
    horizontal = HorizontalScaling(
        mode=ScalingMode.ON,
        min_tasks=1,
        max_tasks=20,
        source=source,
        target_utilization=0.6,
        target_size_recommender="queue-length" if source is HorizontalSource.TARGET_SIZE else "",
        reference_cpu_millicores=reference,
    )
    return replace(
        job_spec(), autopilot=AutopilotConfig(cpu=VerticalScaling(mode=cpu), horizontal=horizontal)
    )


def test_vertical_cpu_on_with_utilisation_against_the_moving_limit_is_refused_naming_the_field() -> None:
    rejection = validate_job_spec(_spec(ScalingMode.ON))
    assert rejection is not None
    assert rejection.field == FIELD
    assert "does not converge" in rejection.message


def test_a_fixed_reference_size_makes_the_combination_admissible() -> None:
    assert validate_job_spec(_spec(ScalingMode.ON, reference=500)) is None


def test_without_vertical_cpu_or_with_a_target_size_source_no_reference_is_needed() -> None:
    assert validate_job_spec(_spec(ScalingMode.OFF)) is None
    assert validate_job_spec(_spec(ScalingMode.DRY_RUN)) is None, "dry-run never changes the limit"
    assert validate_job_spec(_spec(ScalingMode.ON, source=HorizontalSource.TARGET_SIZE)) is None


def test_a_negative_reference_size_is_refused() -> None:
    rejection = validate_job_spec(_spec(ScalingMode.OFF, reference=-1))
    assert rejection is not None
    assert rejection.field == FIELD
