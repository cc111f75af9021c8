"""The §3.2.2 policy table, row by row, and its vectorised evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.job_vocabulary import AppClass, LatencySensitivity, OomTolerance
from cellpilot.recommend.moving_window import WindowStatistics
from cellpilot.recommend.policy import (
    TERMS,
    JobProfile,
    Statistic,
    default_oom_tolerance,
    evaluate_statistics,
    statistic_codes,
    statistic_for,
)
from cellpilot.usage.buckets import Resource


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        (JobProfile(Resource.CPU, AppClass.BATCH), Statistic.AVG),
        (JobProfile(Resource.CPU, AppClass.LATENCY_SENSITIVE, LatencySensitivity.HIGH), Statistic.P95),
        (JobProfile(Resource.CPU, AppClass.LATENCY_SENSITIVE, LatencySensitivity.MODERATE), Statistic.P90),
        (JobProfile(Resource.MEMORY, oom_tolerance=OomTolerance.LOW), Statistic.P98),
        (JobProfile(Resource.MEMORY, oom_tolerance=OomTolerance.MINIMAL), Statistic.MAX),
        (
            JobProfile(Resource.MEMORY, oom_tolerance=OomTolerance.INTERMEDIATE),
            Statistic.MAX_OF_P60_AND_HALF_PEAK,
        ),
        (JobProfile(Resource.MEMORY, AppClass.BATCH, oom_tolerance=OomTolerance.LOW), Statistic.P98),
        (JobProfile(Resource.CPU, AppClass.BATCH, statistic_override=Statistic.MAX), Statistic.MAX),
    ],
    ids=[
        "cpu-batch",
        "cpu-serving-latency-sensitive",
        "cpu-serving",
        "mem-low-oom-tolerance",
        "mem-minimal-oom-tolerance",
        "mem-intermediate-oom-tolerance",
        "mem-ignores-job-class",
        "user-override",
    ],
)
def test_policy_table(profile: JobProfile, expected: Statistic) -> None:
    assert statistic_for(profile) is expected


def stats(s_max: float, s_avg: float, p60: float, p90: float, p95: float, p98: float) -> WindowStatistics:
    return WindowStatistics(
        (60.0, 90.0, 95.0, 98.0), np.array([s_max]), np.array([s_avg]), np.array([[p60, p90, p95, p98]])
    )


HAND = stats(s_max=100.0, s_avg=20.0, p60=30.0, p90=60.0, p95=70.0, p98=90.0)


@pytest.mark.parametrize(
    ("tolerance", "window", "value", "term"),
    [
        (OomTolerance.LOW, HAND, 90.0, "p98"),
        (OomTolerance.MINIMAL, HAND, 100.0, "max"),
        # max(S_p60, 0.5 * S_max): half the peak (50) beats p60 (30) ...
        (OomTolerance.INTERMEDIATE, HAND, 50.0, "0.5*max"),
        # ... and p60 wins when it is larger than half the peak.
        (OomTolerance.INTERMEDIATE, stats(100.0, 20.0, 55.0, 60.0, 70.0, 90.0), 55.0, "p60"),
    ],
    ids=["low->p98", "minimal->max", "intermediate-half-peak-wins", "intermediate-p60-wins"],
)
def test_memory_rows_evaluate_to_the_right_value(
    tolerance: OomTolerance, window: WindowStatistics, value: float, term: str
) -> None:
    code = statistic_for(JobProfile(Resource.MEMORY, oom_tolerance=tolerance))
    values, terms = evaluate_statistics(statistic_codes([code]), window)
    assert float(values[0]) == value
    assert TERMS[int(terms[0])] == term


def test_mixed_policies_in_one_batch() -> None:
    window = WindowStatistics(
        (60.0, 90.0, 95.0, 98.0),
        np.array([10.0, 10.0, 10.0, np.nan]),
        np.array([1.0, 2.0, 3.0, np.nan]),
        np.array([[4.0, 5.0, 6.0, 7.0], [4.0, 5.0, 6.0, 7.0], [4.0, 5.0, 6.0, 7.0], [np.nan] * 4]),
    )
    codes = statistic_codes([Statistic.AVG, Statistic.P95, Statistic.P90, Statistic.MAX])
    values, _ = evaluate_statistics(codes, window)
    assert values[:3].tolist() == [1.0, 6.0, 5.0]
    assert np.isnan(values[3])


def test_missing_percentile_and_bad_codes_are_errors() -> None:
    only_p90 = WindowStatistics((90.0,), np.array([1.0]), np.array([1.0]), np.array([[1.0]]))
    with pytest.raises(KeyError):
        evaluate_statistics(statistic_codes([Statistic.P98]), only_p90)
    with pytest.raises(ValueError):
        evaluate_statistics(np.array([42], dtype=np.int8), HAND)


@pytest.mark.parametrize(
    ("machines", "expected"),
    [(0.5, OomTolerance.MINIMAL), (10.0, OomTolerance.MINIMAL), (10.5, OomTolerance.LOW)],
    ids=["tiny", "at-threshold", "large"],
)
def test_default_oom_tolerance_by_job_size(machines: float, expected: OomTolerance) -> None:
    assert default_oom_tolerance(machines) is expected
