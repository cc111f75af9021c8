"""What the scheduler exports on ``/metrics`` (Prometheus, the gRPC port + 1000: 8700).

=================================================  =============================================
``cellpilot_scheduler_passes_total``               scheduling passes run
``cellpilot_scheduler_pass_seconds_total``         time spent in passes (÷ passes = pass time)
``cellpilot_scheduler_last_pass_seconds``          the latest pass
``cellpilot_scheduler_placements_total``           placements proposed, ``verdict``: accepted/stale
``cellpilot_scheduler_log_sequence``               the copy's log position
``cellpilot_scheduler_pending_tasks``              pending tasks in the copy
=================================================  =============================================
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from cellpilot.platform.metrics import observed

if TYPE_CHECKING:
    from cellpilot_services.scheduler.scheduler_service import Scheduler


def export_scheduler_metrics(meter: Meter, scheduler: Scheduler) -> None:
    stats = scheduler.stats
    meter.create_observable_counter(
        "cellpilot.scheduler.passes", callbacks=[observed(lambda: stats.passes)], unit="{pass}"
    )
    meter.create_observable_counter(
        "cellpilot.scheduler.pass_seconds", callbacks=[observed(lambda: stats.pass_s_total)], unit="s"
    )
    meter.create_observable_gauge(
        "cellpilot.scheduler.last_pass", callbacks=[observed(lambda: stats.last_pass_s)], unit="s"
    )
    meter.create_observable_gauge(
        "cellpilot.scheduler.log_sequence", callbacks=[observed(lambda: scheduler.copy.state.last_sequence)]
    )
    meter.create_observable_gauge(
        "cellpilot.scheduler.pending_tasks",
        callbacks=[observed(lambda: len(scheduler.copy.state.pending))],
        unit="{task}",
    )

    def placements(_: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.accepted, {"verdict": "accepted"})
        yield Observation(stats.stale, {"verdict": "stale"})

    meter.create_observable_counter(
        "cellpilot.scheduler.placements", callbacks=[placements], unit="{placement}", description="proposed"
    )
