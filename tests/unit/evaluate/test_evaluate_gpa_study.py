"""The GPA Monte Carlo study (GPA §5), its synthetic tasks and the trace format."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellpilot.evaluate.gpa_study import (
    DEFAULT_METHODS,
    GpaStudyConfig,
    Method,
    goals,
    overflow_frequency,
    run_instance,
    run_study,
)
from cellpilot.workloads.gpa_tasks import (
    MEAN_TASK_USAGE,
    SHAPE_FAMILIES,
    GpaTrace,
    read_gpa_trace,
    synthetic_usage,
    write_gpa_trace,
)


def test_overflow_frequency_matches_a_plain_loop() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 0.5, (9, 50)).astype(np.float32)
    assignment = np.array([0, 1, 2, 0, 1, 2, 0, 1, 0])
    count = 0
    for j in range(3):
        for t in range(50):
            total = sum(float(x[i, t]) for i in range(9) if assignment[i] == j)
            count += total > 1.0
    assert overflow_frequency(x, assignment, 3, 1.0) == pytest.approx(count / (3 * 50))


@pytest.mark.parametrize(
    ("observe", "observed", "evaluated"),
    [(1.0, (0, 100), (0, 100)), (0.1, (0, 10), (10, 100)), (0.001, (0, 1), (1, 100))],
    ids=["clairvoyant", "tenth", "one-sample"],
)
def test_observation_and_evaluation_sets(
    observe: float, observed: tuple[int, int], evaluated: tuple[int, int]
) -> None:
    obs, ev = GpaStudyConfig(observe=observe).split(100)
    assert (obs.start, obs.stop) == observed
    assert (ev.start, ev.stop) == evaluated


def test_one_instance_by_hand() -> None:
    # Four constant tasks of 0.3 and two of 0.6: av-1 packs by size, perc-100 by maximum.
    x = np.array([[0.3] * 4] * 4 + [[0.6] * 4] * 2, dtype=np.float32)
    config = GpaStudyConfig(realizations=4, methods=(Method("av", 1.0), Method("gpa", 0.05)), rebalance=False)
    result = run_instance(x, config)
    assert result.m_norm == math.ceil(4 * 0.3 + 2 * 0.6 - 1e-9)
    # Best fit: [0.3 0.3 0.3] [0.3 0.6] [0.6] -> 3 machines, never over capacity.
    assert result.machines["av-1"] == 3
    assert result.q["av-1"] == 0.0
    assert result.machines["gpa-0.05"] == 3  # zero variance: GPA is exact here


def test_study_has_a_row_per_method_with_paper_names() -> None:
    config = GpaStudyConfig(instances=2, tasks=150, realizations=400, seed=3)
    summary = run_study(config)
    names = [row["method"] for row in summary["rows"]]
    assert names == [m.name for m in DEFAULT_METHODS]
    assert {"gpa-0.01", "gpa-0.1", "perc-90", "av-1.25", "cantelli-1.7"} <= set(names)
    for row in summary["rows"]:
        assert row["m"] > 0
        assert 0.0 <= row["q"] <= 1.0
        assert len(row["q_per_instance"]) == 2
    by_name = {row["method"]: row for row in summary["rows"]}
    # More conservative methods never use fewer machines on the same instances.
    assert by_name["perc-100"]["m"] >= by_name["perc-90"]["m"] >= by_name["perc-50"]["m"]
    assert by_name["gpa-0.001"]["m"] >= by_name["gpa-0.1"]["m"]
    assert by_name["perc-100"]["q"] == 0.0  # packing by the maximum never overflows (clairvoyant)


def test_study_is_reproducible_from_its_seed() -> None:
    config = GpaStudyConfig(instances=1, tasks=80, realizations=200, seed=11)
    assert run_study(config)["rows"] == run_study(config)["rows"]


def test_goals_read_the_rows() -> None:
    rows = [
        {"method": "gpa-0.1", "kind": "gpa", "m": 1.2, "q": 0.12, "q_relative_error": 0.2},
        {"method": "gpa-0.01", "kind": "gpa", "m": 1.5, "q": 0.014, "q_relative_error": 0.4},
        {"method": "perc-90", "kind": "perc", "m": 1.4},
        {"method": "cantelli-1", "kind": "cantelli", "m": 1.9},
    ]
    result = goals(rows)
    assert result["gpa-0.1_q_within_30pct"]["met"]
    assert not result["gpa-0.01_q_within_30pct"]["met"]
    assert result["gpa-0.1_fewer_machines_than_perc-90"]["met"]
    assert not result["gpa-0.01_fewer_machines_than_perc-90"]["met"]
    assert result["gpa-0.01_fewer_machines_than_cantelli-1"]["met"]
    assert "gpa-0.05_q_within_30pct" not in result


def test_synthetic_tasks_follow_the_papers_statistics() -> None:
    x, families = synthetic_usage(3000, 2000, np.random.default_rng(1))
    assert x.dtype == np.float32
    assert float(x.min()) >= 0.0
    assert float(x.max()) <= 1.0
    # GPA Table 1: 13.69 for 500 tasks, i.e. a mean task of 0.0274 of the largest machine.
    assert float(x.mean()) == pytest.approx(MEAN_TASK_USAGE, rel=0.15)
    shares = {name: families.count(name) / len(families) for name, _ in SHAPE_FAMILIES}
    assert shares["near-zero"] == pytest.approx(0.465, abs=0.04)  # clusters (c), (f), (k)
    # Not one distribution: the near-zero family is far more skewed than the uniform one.
    idx = np.array(families)
    skew = {}
    for name in ("near-zero", "uniform"):
        rows = x[idx == name].astype(np.float64)
        centred = rows - rows.mean(axis=1, keepdims=True)
        skew[name] = float(np.median((centred**3).mean(axis=1) / rows.std(axis=1) ** 3))
    assert skew["near-zero"] > 2.0 > abs(skew["uniform"])


def test_trace_round_trip_and_format() -> None:
    trace = GpaTrace(("a", "b"), np.array([[0.1, 0.2, 0.3], [0.0, 0.5, 1.0]], dtype=np.float32))
    lines = list(write_gpa_trace(trace))
    parsed = read_gpa_trace(lines)
    assert parsed.task_ids == ("a", "b")
    np.testing.assert_allclose(parsed.inst, trace.inst)
    plain = read_gpa_trace(
        ["# comment", "", "t1, 0.1, 0.2", "t2 0.3 0.4  # trailing", "t1 avg 0.15 0.15", "t2 avg 0.35 0.35"]
    )
    np.testing.assert_allclose(plain.inst, [[0.1, 0.2], [0.3, 0.4]])
    assert plain.avg is not None
    np.testing.assert_allclose(plain.avg, [[0.15, 0.15], [0.35, 0.35]])
    with pytest.raises(ValueError, match="without avg"):
        read_gpa_trace(["t1 0.1", "t2 0.2", "t1 avg 0.1"])


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["a 0.1 0.2", "b 0.1"], "same number"),
        (["a 0.1 -0.2"], ">= 0"),
        (["a x y"], "line 1"),
        (["a"], "no samples"),
        (["a 0.1", "a 0.2"], "twice"),
        (["a avg 0.1"], "no instantaneous"),
    ],
    ids=["ragged", "negative", "not-a-number", "empty", "duplicate", "avg-only"],
)
def test_trace_errors(lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_gpa_trace(lines)


def test_trace_pool_instances_sample_tasks_without_replacement() -> None:
    pool = np.tile(np.arange(20, dtype=np.float32)[:, None] / 100, (1, 30))
    config = GpaStudyConfig(instances=3, tasks=20, realizations=30, methods=(Method("av", 1.0),))
    summary = run_study(config, trace_pool=pool)
    assert summary["settings"]["source"] == "trace"
    # Every instance holds all 20 tasks exactly once: total mean 1.9 -> m_norm = 2.
    assert summary["m_norm_mean"] == 2
    with pytest.raises(ValueError, match="fewer than"):
        run_study(GpaStudyConfig(instances=1, tasks=21, realizations=30), trace_pool=pool)
