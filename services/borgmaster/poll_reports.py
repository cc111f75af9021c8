"""The master applying Borglet reports (Borg §3.3): diff, commit, refresh the soft state.

One implementation for both ways reports arrive: the master's own polls
(:mod:`borglet_poller`, and its own link shard) and the differences the standbys' link shards
forward (:mod:`link_shard_master`). Each report is diffed against the state
(:mod:`cellpilot.borg.poll_diff`); the transitions of all the reports, and the machines that
missed ``missed_polls_down`` polls in a row, are committed through the log in one append; then
the soft state (usage, readiness, the GPA CPU samples, last contact) is refreshed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cellpilot.api.v1 import borglet_pb2
from cellpilot.borg.mutations import Mutation
from cellpilot.borg.poll_diff import diff_report, machines_down
from cellpilot.platform.request_validation import InvalidField
from cellpilot.schedule import Resources
from cellpilot_services.borgmaster import convert, poll_convert
from cellpilot_services.borgmaster.replica import NotLeader, Replica, now_ms

log = logging.getLogger(__name__)


@dataclass
class AppliedReports:
    mutations: int = 0
    duplicates: int = 0
    # Machines running duplicates: their next poll carries the desired set again.
    resend: set[str] = field(default_factory=set)
    # Machines whose report was diffed (the others were malformed).
    applied: set[str] = field(default_factory=set)


async def apply_reports(
    replica: Replica,
    responses: Sequence[borglet_pb2.PollResponse],
    missed: Mapping[str, int] | None,
    cause_id: str,
) -> AppliedReports:
    """Diffs ``responses`` against the state and commits what they imply (takes the lock).

    ``missed``: failed polls in a row per machine, judged against ``missed_polls_down``
    (None: no machine is judged, as for an urgent poll of a few machines).
    """
    settings = replica.settings
    out = AppliedReports()
    mutations: list[Mutation] = []
    async with replica.lock:
        if not replica.is_leader:
            raise NotLeader(None)
        state = replica.state
        diffs = []
        for response in responses:
            try:
                report = poll_convert.report_in(response)
            except InvalidField as error:
                log.warning(
                    "malformed poll response", extra={"machine_id": response.machine_id, "error": str(error)}
                )
                continue
            diff = diff_report(state, report, settings.max_task_failures, settings.restart_policy)
            diffs.append((response, diff))
            out.applied.add(response.machine_id)
            mutations += diff.mutations
            out.duplicates += len(diff.duplicates)
            if diff.duplicates:
                out.resend.add(response.machine_id)
                log.info(
                    "duplicates on a returning machine; telling it to kill them",
                    extra={"machine_id": response.machine_id, "duplicates": len(diff.duplicates)},
                )
        if missed is not None:
            mutations += machines_down(state, missed, settings.missed_polls_down)
        if mutations:
            event_time = max((r.event_time_ms for r in responses), default=0) or now_ms()
            await replica.commit(mutations, cause_id=cause_id, event_time_ms=event_time)
        out.mutations = len(mutations)
        usage: dict[tuple[str, int], Resources] = {}
        cpu_samples = []
        soft = replica.soft
        for response, diff in diffs:
            machine_id = response.machine_id
            # A report of a new event-second is a fresh CPU demand sample of the machine
            # and its tasks (GPA §4: cellpilot.schedule.cpu_demand); a repeat is not.
            machine = state.machines.get(machine_id)
            fresh = response.event_time_ms // 1000 > soft.last_contact_ms.get(machine_id, 0) // 1000
            if fresh and machine is not None:
                cpu_samples.append((diff.cpu_demand, machine.spec.capacity.cpu))
            soft.last_contact_ms[machine_id] = response.event_time_ms
            soft.latest_event_ms = max(soft.latest_event_ms, response.event_time_ms)
            soft.machine_usage[machine_id] = convert.resources_in(response.usage, "poll.usage")
            soft.cached_packages[machine_id] = tuple(response.cached_package_ids)
            soft.task_usage.update(diff.usage)
            soft.task_ready.update(diff.ready)
            usage.update(diff.usage)
        replica.view.update_usage(usage, now_ms())
        replica.view.observe_cpu(cpu_samples)
    return out
