"""API messages in words: the labels, amounts and explanations the CLI and the dashboard both show.

Wire types stop at the shell (docs/architecture.md rule 2), so what turns a v1 message into text
for a person lives here, beside the client that fetches it, and every client-side view (the
``cellpilot`` command, the dashboard) words a recommendation, a mode or a state the same way.
"""

from __future__ import annotations

from typing import Any

from cellpilot.api.v1 import job_pb2, recommendation_pb2, resources_pb2
from cellpilot.units import GIB, MIB


def enum_label(enum: Any, value: int, prefix: str) -> str:
    """``JOB_STATE_RUNNING`` -> ``running``."""
    name: str = enum.Name(value)
    return name.removeprefix(prefix).lower().replace("_", "-")


def cores(millicores: float) -> str:
    return f"{millicores / 1000:.3g}"


def gib(memory_bytes: float) -> str:
    return f"{memory_bytes / GIB:.3g}Gi" if memory_bytes >= GIB else f"{memory_bytes / MIB:.4g}Mi"


def recommender_name(ref: job_pb2.RecommenderRef) -> str:
    """``RECOMMENDER_KIND_MOVING_WINDOW_P95`` -> ``moving-window-p95``; custom ones by name."""
    if ref.kind == job_pb2.RECOMMENDER_KIND_CUSTOM:
        return f"custom:{ref.custom_name}"
    return enum_label(job_pb2.RecommenderKind, ref.kind or job_pb2.RECOMMENDER_KIND_AUTO, "RECOMMENDER_KIND_")


def autopilot_modes(config: job_pb2.AutopilotConfig) -> str:
    """The resources Autopilot scales for a job and how: ``cpu:on mem:dry-run``, or ``off``."""
    parts = []
    for name, mode in (
        ("cpu", config.cpu.mode),
        ("mem", config.memory.mode),
        ("tasks", config.horizontal.mode),
    ):
        if mode not in (job_pb2.SCALING_MODE_UNSPECIFIED, job_pb2.SCALING_MODE_OFF):
            parts.append(f"{name}:{enum_label(job_pb2.ScalingMode, mode, 'SCALING_MODE_')}")
    return " ".join(parts) or "off"


def amount(resource: int, value: float) -> str:
    """A value of ``resource`` (a ``Resource`` wire value) in cores or bytes, as a person reads it."""
    return f"{cores(value)} cores" if resource == resources_pb2.RESOURCE_CPU else gib(value)


def why(recommendation: recommendation_pb2.Recommendation) -> str:
    """The chosen value's explanation in words (Autopilot §3.2: limits must be explainable)."""
    e = recommendation.explanation
    parts = []
    if e.statistic:
        parts.append(e.statistic)
    if e.HasField("ml_model"):
        m = e.ml_model
        margin = amount(recommendation.resource, m.safety_margin)
        parts.append(f"ML model #{m.model_index} (decay {m.decay_rate:g}, margin {margin})")
    if recommendation.margin:
        parts.append(f"+ margin {amount(recommendation.resource, recommendation.margin)}")
    if e.clamped_by not in (
        recommendation_pb2.CLAMP_REASON_UNSPECIFIED,
        recommendation_pb2.CLAMP_REASON_NONE,
    ):
        clamp = enum_label(recommendation_pb2.ClampReason, e.clamped_by, "CLAMP_REASON_")
        parts.append(f"clamped by {clamp} (from {amount(recommendation.resource, e.unclamped_value)})")
    if e.note:
        parts.append(e.note)
    return ", ".join(parts)
