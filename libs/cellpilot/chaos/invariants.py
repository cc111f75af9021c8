"""The invariants a chaos run checks, as pure functions of what it saw and what the stores hold.

Inputs are plain data: the :class:`~cellpilot.chaos.stream_ledger.StreamLedger` (the broker's
streams as an independent reader saw them), the :class:`~cellpilot.chaos.evidence.StoreEvidence`
(the checkpoint log, the aggregator's tables, Redis) and the consumers' log-reset warnings.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cellpilot.chaos.evidence import LoggedActuation, LoggedLogReset, StoreEvidence
from cellpilot.chaos.forger import FORGED_KEY_PREFIX, FORGED_TOKEN
from cellpilot.chaos.stream_ledger import SAMPLES, ActuationSeen, RefusalSeen, SampleBatchSeen, StreamLedger


def decreases(tokens: Iterable[int]) -> int:
    """How many tokens are below one seen before them (0: the sequence never goes back)."""
    highest, count = 0, 0
    for token in tokens:
        if token < highest:
            count += 1
        highest = max(highest, token)
    return count


def decreases_per_job(actuations: Sequence[LoggedActuation]) -> int:
    by_job: dict[str, list[int]] = defaultdict(list)
    for actuation in actuations:
        by_job[actuation.job_id].append(actuation.fencing_token)
    return sum(decreases(tokens) for tokens in by_job.values())


def decreases_per_partition(actuations: Sequence[ActuationSeen]) -> int:
    """Token decreases along each partition log of ``actuations`` (each log of a restarted broker apart)."""
    by_log: dict[tuple[int, int], list[ActuationSeen]] = defaultdict(list)
    for actuation in actuations:
        by_log[(actuation.generation, actuation.partition)].append(actuation)
    return sum(
        decreases(a.fencing_token for a in sorted(log, key=lambda a: a.offset)) for log in by_log.values()
    )


def tokens_with_two_leaders(actuations: Sequence[ActuationSeen]) -> int:
    """Fencing tokens that more than one Autopilot replica published under (one term, one master)."""
    leaders: dict[int, set[str]] = defaultdict(set)
    for actuation in actuations:
        leaders[actuation.fencing_token].add(actuation.leader_id)
    return sum(1 for holders in leaders.values() if len(holders) > 1)


def applied_twice(actuations: Sequence[LoggedActuation]) -> int:
    """Actuations (idempotency keys) the Borgmaster applied more than once: the extra applications."""
    counts = Counter(a.request_id for a in actuations)
    return sum(n - 1 for n in counts.values() if n > 1)


def first_actuation_after(
    actuations: Sequence[LoggedActuation], at: float, job_id: str | None = None, after_seq: int = 0
) -> LoggedActuation | None:
    """The first actuation applied after wall time ``at`` (and after log position ``after_seq``),
    on ``job_id`` if given."""
    for actuation in actuations:
        if actuation.appended_at > at and actuation.seq > after_seq and job_id in (None, actuation.job_id):
            return actuation
    return None


def conflicting(digests: Iterable[set[str]]) -> int:
    """Keys (one set of content digests each) published more than once with different content."""
    return sum(1 for seen in digests if len(seen) > 1)


@dataclass(frozen=True)
class WindowApplication:
    published: int  # job windows (per resource) the aggregator published, up to what was applied
    applied: int  # windows the recommenders folded in (their ML ensembles count updates)
    double_applied: int  # applied beyond what was published: a window folded in twice
    missed: int  # published but never folded in (lost with a broker's log before it was read)


def window_application(evidence: StoreEvidence) -> WindowApplication:
    published = applied = double = missed = 0
    for key, (updates, last_end_ms) in evidence.recommender_windows.items():
        windows = sum(1 for end in evidence.published_windows.get(key, []) if end <= last_end_ms)
        published += windows
        applied += updates
        double += max(0, updates - windows)
        missed += max(0, windows - updates)
    return WindowApplication(published, applied, double, missed)


@dataclass(frozen=True)
class SampleAccount:
    """Samples of the windows every aggregator partition has closed (ending by ``through_ms``).

    ``published`` = ``aggregated`` + ``late`` + ``lost_with_broker_log`` + ``unexplained``.
    """

    through_ms: int | None
    published: int  # distinct batches (machine, sequence) on usage.samples, as the reader saw them
    aggregated: int  # in the aggregator's closed task windows
    late: int  # arrived after their window had closed: counted and dropped by the aggregator
    lost_with_broker_log: int  # in a log the broker lost, beyond what the aggregator had applied
    lost_batches: int
    partitions_without_reset_warning: int  # old logs no aggregator warned about (loss unknown)
    duplicate_batches: int  # batches the aggregator received twice and dropped once

    @property
    def unexplained(self) -> int:
        return self.published - self.aggregated - self.late - self.lost_with_broker_log


def _samples_through(batch: SampleBatchSeen, through_ms: int) -> int:
    return sum(n for end, n in batch.samples_by_window_end.items() if end <= through_ms)


def account_samples(
    ledger: StreamLedger,
    evidence: StoreEvidence,
    broker_restarts_at: Sequence[float],
    aggregator_resets: Sequence[LoggedLogReset],
) -> SampleAccount:
    """Published vs aggregated samples, with what the broker's lost logs took.

    Log generation ``g`` of a partition ended with broker restart ``g``; the aggregator's first
    reset warning for that partition after the restart gives the position it had applied the
    old log up to: the records beyond it were lost, unless the same batch (a Borglet resends one
    whose acknowledgement it missed) is in another log.
    """
    through = evidence.closed_through_ms
    if through is None:
        return SampleAccount(None, 0, 0, evidence.late_samples, 0, 0, 0, evidence.duplicate_batches)
    copies = Counter((b.machine_id, b.sequence) for b in ledger.samples)
    published: dict[tuple[str, int], int] = {}
    for batch in ledger.samples:
        published.setdefault((batch.machine_id, batch.sequence), _samples_through(batch, through))
    restarts = sorted(broker_restarts_at)
    lost = lost_batches = unknown = 0
    old_logs = {(b.generation, b.partition) for b in ledger.samples if b.generation < len(restarts)}
    for generation, partition in sorted(old_logs):
        ends_at = restarts[generation]
        next_restart = restarts[generation + 1] if generation + 1 < len(restarts) else float("inf")
        applied_to = next(
            (r.stored_offset for r in aggregator_resets
             if r.topic == SAMPLES and r.partition == partition and ends_at <= r.at < next_restart),
            None,
        )  # fmt: skip
        if applied_to is None:
            unknown += 1
            continue
        for batch in ledger.samples:
            in_old_log = (batch.generation, batch.partition) == (generation, partition)
            beyond = in_old_log and batch.offset >= applied_to
            if beyond and copies[(batch.machine_id, batch.sequence)] == 1:  # not sent again elsewhere
                lost += _samples_through(batch, through)
                lost_batches += 1
    return SampleAccount(
        through,
        sum(published.values()),
        evidence.aggregated_samples,
        evidence.late_samples,
        lost,
        lost_batches,
        unknown,
        evidence.duplicate_batches,
    )


@dataclass(frozen=True)
class ForgedApplied:
    """Traces of the forger's records in the stores: each would mean a forged record was applied."""

    actuations: int  # actuations the Borgmaster applied under the forged token or a forged key
    sample_windows: int  # the aggregator's windows of the forged job
    recommendation_candidates: int  # Autopilot's candidates for the forged job

    @property
    def total(self) -> int:
        return self.actuations + self.sample_windows + self.recommendation_candidates

    def describe(self) -> str:
        return (
            f"{self.actuations} actuations applied, {self.sample_windows} sample windows aggregated,"
            f" {self.recommendation_candidates} recommendations taken as candidates"
        )


def forged_applied(evidence: StoreEvidence) -> ForgedApplied:
    actuations = sum(
        1
        for a in evidence.actuations
        if a.fencing_token == FORGED_TOKEN or a.request_id.startswith(FORGED_KEY_PREFIX)
    )
    return ForgedApplied(actuations, evidence.forged_job_windows, evidence.forged_job_candidates)


def unrefused(written: Sequence[tuple[str, str, str]], refusals: Sequence[RefusalSeen]) -> list[str]:
    """The forger's records (topic, value digest, what) no reader filed a refusal of."""
    filed = {(r.topic, r.value_digest) for r in refusals if r.reason}
    return [what for topic, digest, what in written if (topic, digest) not in filed]
