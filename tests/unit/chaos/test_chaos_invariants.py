"""The chaos run's invariants, on hand-made evidence (cellpilot.chaos.invariants)."""

from __future__ import annotations

import pytest

from cellpilot.chaos.chaos_run import ServicePorts
from cellpilot.chaos.evidence import LoggedActuation, LoggedLogReset, StoreEvidence
from cellpilot.chaos.invariants import (
    account_samples,
    applied_twice,
    conflicting,
    decreases,
    decreases_per_job,
    decreases_per_partition,
    first_actuation_after,
    tokens_with_two_leaders,
    window_application,
)
from cellpilot.chaos.stream_ledger import (
    SAMPLES,
    ActuationSeen,
    SampleBatchSeen,
    StreamLedger,
    samples_by_window_end,
)

W = 300_000


def _logged(seq: int, job: str, token: int, key: str, at: float = 0.0) -> LoggedActuation:
    return LoggedActuation(seq, at, job, token, key)


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [([], 0), ([1, 1, 2, 3], 0), ([1, 2, 1], 1), ([3, 1, 2, 4], 2), ([2, 2, 1, 1], 2)],
)
def test_decreases_counts_tokens_below_one_seen_before(tokens: list[int], expected: int) -> None:
    assert decreases(tokens) == expected


def test_tokens_are_checked_per_job_per_partition_log_and_per_master() -> None:
    logged = [_logged(1, "a", 2, "k1"), _logged(2, "b", 1, "k2"), _logged(3, "a", 3, "k3")]
    assert decreases([a.fencing_token for a in logged]) == 1, "across jobs the log went back"
    assert decreases_per_job(logged) == 0, "each job's tokens only grew"
    seen = [
        ActuationSeen(0, 0, 5, "a", 2, "autopilot-0", "k1"),
        ActuationSeen(0, 0, 6, "a", 1, "autopilot-1", "k2"),  # behind on the same log
        ActuationSeen(1, 0, 0, "a", 1, "autopilot-1", "k3"),  # a new log after a broker restart
    ]
    assert decreases_per_partition(seen) == 1
    assert tokens_with_two_leaders(seen) == 0
    assert tokens_with_two_leaders([*seen, ActuationSeen(1, 1, 0, "b", 2, "autopilot-1", "k4")]) == 1


def test_an_actuation_is_applied_twice_when_its_key_is_in_the_log_twice() -> None:
    assert applied_twice([_logged(1, "a", 1, "k1"), _logged(2, "a", 1, "k2")]) == 0
    assert applied_twice([_logged(1, "a", 1, "k1"), _logged(5, "a", 1, "k1"), _logged(6, "a", 1, "k1")]) == 2


def test_the_first_actuation_after_a_fault_on_a_job_after_an_edit() -> None:
    logged = [
        _logged(3, "a", 1, "k1", at=10.0),
        _logged(7, "b", 1, "k2", at=12.0),
        _logged(9, "a", 1, "k3", at=15.0),
    ]
    assert first_actuation_after(logged, 11.0) == logged[1]
    assert first_actuation_after(logged, 9.0, "a", after_seq=5) == logged[2]
    assert first_actuation_after(logged, 16.0) is None


def test_conflicting_keys_have_two_contents() -> None:
    assert conflicting([{"x"}, {"x", "y"}, {"z"}]) == 1


def test_windows_folded_in_beyond_those_published_are_double_applied() -> None:
    evidence = StoreEvidence(
        published_windows={("a", 1): [W, 2 * W, 3 * W], ("a", 2): [W, 2 * W, 3 * W], ("b", 1): [W, 2 * W]},
        # a: CPU applied through window 3 exactly; memory folded one in twice; b: one missed.
        recommender_windows={("a", 1): (3, 3 * W), ("a", 2): (4, 3 * W), ("b", 1): (1, 2 * W)},
    )
    applied = window_application(evidence)
    assert (applied.published, applied.applied, applied.double_applied, applied.missed) == (8, 8, 1, 1)


def _batch(generation: int, partition: int, offset: int, sequence: int, times: list[int]) -> SampleBatchSeen:
    return SampleBatchSeen(generation, partition, offset, "m1", sequence, samples_by_window_end(times, W))


def test_samples_per_window_end() -> None:
    assert samples_by_window_end([0, 1, W - 1, W, 3 * W + 5], W) == {W: 3, 2 * W: 1, 4 * W: 1}


def test_samples_lost_with_a_broker_log_are_those_beyond_the_aggregators_position() -> None:
    ledger = StreamLedger(
        samples=[
            _batch(0, 0, 0, 1, [10, 20]),  # applied before the broker died
            _batch(0, 0, 1, 2, [30]),  # lost: beyond the aggregator's position 1
            _batch(0, 0, 2, 3, [40, 50]),  # resent by the Borglet into the new log: not lost
            _batch(1, 0, 0, 3, [40, 50]),
            _batch(1, 0, 1, 4, [60, W + 1]),  # the second sample's window is not closed yet
        ]
    )
    evidence = StoreEvidence(closed_through_ms=W, aggregated_samples=5, late_samples=1)
    resets = [
        LoggedLogReset("aggregator-0", 99.0, SAMPLES, 0, 7, 0),  # before the restart: another log
        LoggedLogReset("aggregator-0", 101.0, SAMPLES, 0, 1, 0),
    ]
    account = account_samples(ledger, evidence, [100.0], resets)
    assert account.published == 6  # batches 1, 2, 3 (once), 4 (one sample closed)
    assert (account.lost_with_broker_log, account.lost_batches) == (1, 1)
    assert account.unexplained == 6 - 5 - 1 - 1
    assert account.partitions_without_reset_warning == 0
    unknown = account_samples(ledger, evidence, [100.0], [])
    assert (unknown.lost_with_broker_log, unknown.partitions_without_reset_warning) == (0, 1)


def test_a_chaos_run_moves_every_service_and_tells_each_client_where_the_borgmasters_are() -> None:
    env = ServicePorts(40_000).env()
    assert env["CELLPILOT_BORGMASTER_BASE_PORT"] == "40000"
    assert env["CELLPILOT_ACTUATOR_BASE_PORT"] == "40010"
    borgmasters = "127.0.0.1:40000,127.0.0.1:40001,127.0.0.1:40002"
    for client in ("BORGLET", "AUTOPILOT", "ACTUATOR"):
        assert env[f"CELLPILOT_{client}_BORGMASTER_ADDRESSES"] == borgmasters
    assert env["CELLPILOT_RECOMMENDER_METRICS_PORT"] == "0", "metrics on any free port, never 8500"
