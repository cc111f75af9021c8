"""What a Borgmaster replica exports on ``/metrics`` (Prometheus, the gRPC port + 1000: 8100-8102).

Observable instruments read the replica when scraped, so the hot paths record nothing:

=================================================  =============================================
``cellpilot_borgmaster_leader``                    1 on the elected master, 0 on a follower
``cellpilot_borgmaster_log_sequence``              the replica's applied log position
``cellpilot_borgmaster_pending_tasks``             pending tasks of released jobs
``cellpilot_borgmaster_queued_stimuli``            stimuli waiting for the master's next append
``cellpilot_borgmaster_appends_total``             fenced appends (one per group-commit batch)
``cellpilot_borgmaster_appended_records_total``    records those appends carried
``cellpilot_borgmaster_append_seconds_total``      time spent in appends (÷ appends = latency)
``cellpilot_borgmaster_last_append_seconds``       the latest append's round trip
``cellpilot_borgmaster_proposals_total``           schedulers' proposal batches judged
``cellpilot_borgmaster_placements_total``          proposed placements, ``verdict``: accepted/stale
=================================================  =============================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from cellpilot.platform.metrics import observed
from cellpilot_services.borgmaster.replica import Replica


def export_master_metrics(meter: Meter, replica: Replica) -> None:
    core = replica.core
    stats = replica.group_commit.stats

    def gauge(name: str, unit: str, description: str, read: Callable[[], float]) -> None:
        meter.create_observable_gauge(name, callbacks=[observed(read)], unit=unit, description=description)

    def counter(name: str, unit: str, description: str, read: Callable[[], float]) -> None:
        meter.create_observable_counter(name, callbacks=[observed(read)], unit=unit, description=description)

    gauge("cellpilot.borgmaster.leader", "1", "1 on the elected master", lambda: int(replica.is_leader))
    gauge("cellpilot.borgmaster.log_sequence", "1", "applied log position", lambda: core.state.last_sequence)
    gauge(
        "cellpilot.borgmaster.pending_tasks",
        "{task}",
        "pending tasks of released jobs",
        lambda: len(core.state.pending),
    )
    gauge(
        "cellpilot.borgmaster.queued_stimuli",
        "{stimulus}",
        "stimuli waiting for the next append",
        lambda: replica.group_commit.queued,
    )
    counter("cellpilot.borgmaster.appends", "{append}", "fenced appends", lambda: stats.batches)
    counter("cellpilot.borgmaster.appended_records", "{record}", "records appended", lambda: stats.records)
    counter("cellpilot.borgmaster.append_seconds", "s", "time spent in appends", lambda: stats.append_s_total)
    gauge(
        "cellpilot.borgmaster.last_append", "s", "the latest append's round trip", lambda: stats.last_append_s
    )
    counter(
        "cellpilot.borgmaster.proposals",
        "{proposal}",
        "proposal batches judged",
        lambda: core.proposals.proposals,
    )

    def placements(_: CallbackOptions) -> Iterable[Observation]:
        yield Observation(core.proposals.accepted, {"verdict": "accepted"})
        yield Observation(core.proposals.stale, {"verdict": "stale"})

    meter.create_observable_counter(
        "cellpilot.borgmaster.placements",
        callbacks=[placements],
        unit="{placement}",
        description="proposed placements by the master's verdict",
    )
