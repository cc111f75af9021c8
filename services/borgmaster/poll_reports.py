"""Borglet reports into the master's core (Borg §3.3), however they arrive.

One implementation for both ways reports arrive: the master's own polls (:mod:`borglet_poller`,
and its own link shard) and the differences the standbys' link shards forward
(:mod:`link_shard_master`). Each poll response is converted (a malformed one is logged and left
out: it fails that machine's report, never the others'), and the reports go to the core as one
:class:`cellpilot.borg.master_core.MachineReports` stimulus: diffed against the state, their
transitions and the machines that missed ``missed_polls_down`` polls in a row committed in one
append, then the soft state refreshed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from cellpilot.api.v1 import borglet_pb2
from cellpilot.borg.master_core import AppliedReports, MachineReports
from cellpilot.borg_wire import borglet_polls
from cellpilot.platform.request_validation import InvalidField
from cellpilot_services.borgmaster.replica import Replica

log = logging.getLogger(__name__)
REPORTS_PER_STIMULUS = 250


async def apply_reports(
    replica: Replica,
    responses: Sequence[borglet_pb2.PollResponse],
    missed: Mapping[str, int] | None,
    cause_id: str,
) -> AppliedReports:
    """Submits the reports ``responses`` hold (and the machines ``missed`` counts) to the core.

    ``missed``: failed polls in a row per machine, judged against ``missed_polls_down``
    (None: no machine is judged, as for an urgent poll of a few machines).
    """
    reports = []
    for response in responses:
        try:
            reports.append(borglet_polls.report_in(response))
        except InvalidField as error:
            log.warning(
                "malformed poll response", extra={"machine_id": response.machine_id, "error": str(error)}
            )
    if not reports and not missed:
        return AppliedReports()
    # A stimulus per REPORTS_PER_STIMULUS reports: the core decides each in one step on the event
    # loop, and a 10 000-machine shard's reports at once would hold it for seconds. The misses are
    # judged with the last one, once every report of the cycle is in.
    chunks = [
        reports[i : i + REPORTS_PER_STIMULUS] for i in range(0, len(reports), REPORTS_PER_STIMULUS)
    ] or [[]]
    parts: list[AppliedReports] = []
    for i, chunk in enumerate(chunks):
        part, _ = await replica.submit(
            MachineReports(tuple(chunk), missed if i == len(chunks) - 1 else None, cause_id)
        )
        assert isinstance(part, AppliedReports)
        parts.append(part)
    applied = AppliedReports(
        sum(p.mutations for p in parts),
        sum(p.duplicates for p in parts),
        frozenset().union(*(p.resend for p in parts)),
        frozenset().union(*(p.applied for p in parts)),
    )
    for machine_id in sorted(applied.resend):
        log.info(
            "duplicates on a returning machine; telling it to kill them", extra={"machine_id": machine_id}
        )
    return applied
