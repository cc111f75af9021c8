"""Cost-against-harm frontiers (evaluate.frontier) and the horizontal study's frontier check
(evaluate.horizontal_frontiers) on hand-made points."""

from __future__ import annotations

from typing import Any

import pytest

from cellpilot.evaluate.frontier import covering, dominates, nearest_misses, pareto_frontier
from cellpilot.evaluate.horizontal_frontiers import (
    frontier_goals,
    frontier_report,
    recommended_settings,
    setting_label,
    workload_frontier,
)


def test_dominates_needs_no_worse_on_both_and_better_on_one() -> None:
    assert dominates((1.0, 5.0), (2.0, 5.0))
    assert dominates((2.0, 4.0), (2.0, 5.0))
    assert not dominates((2.0, 5.0), (2.0, 5.0))  # equal: neither dominates
    assert not dominates((1.0, 6.0), (2.0, 5.0))  # cheaper but more harm: a trade-off


def test_pareto_frontier_keeps_the_non_dominated_points_by_increasing_cost() -> None:
    points = [(10.0, 0.0), (5.0, 8.0), (7.0, 3.0), (8.0, 3.0), (6.0, 9.0), (5.0, 8.0), (12.0, 0.0)]
    # (8, 3) is beaten by (7, 3); (6, 9) by (5, 8); (12, 0) by (10, 0); the second (5, 8) repeats the first.
    assert pareto_frontier(points) == [1, 2, 0]
    assert pareto_frontier([]) == []
    assert pareto_frontier([(3.0, 3.0)]) == [0]


def test_pareto_frontier_treats_harms_within_rounding_as_equal() -> None:
    assert pareto_frontier([(1.0, 2.0), (2.0, 2.0 - 1e-12)]) == [0]


def test_covering_allows_the_cost_slack_and_no_more_harm_least_harm_first() -> None:
    target = (100.0, 10.0)
    candidates = [(105.0, 10.0), (105.1, 0.0), (90.0, 10.5), (104.0, 2.0), (80.0, 9.0)]
    assert covering(target, candidates, 0.05) == [3, 4, 0]
    assert covering(target, candidates, 0.0) == [4]
    with pytest.raises(ValueError, match="non-negative"):
        covering(target, candidates, -0.1)


def test_nearest_misses_say_how_close_the_candidates_come() -> None:
    target = (100.0, 1.0)
    candidates = [(104.0, 6.0), (90.0, 9.0), (150.0, 0.0), (120.0, 1.0)]
    assert nearest_misses(target, candidates, 0.05) == (0, 3)
    assert nearest_misses((10.0, 0.0), [(50.0, 1.0)], 0.05) == (None, None)


def _row(
    workload: str, decider: str, setting: dict[str, float], task_hours: float, overload: float
) -> dict[str, Any]:
    return {"workload": workload, "decider": decider, "setting": setting, "default": False,
            "task_hours": task_hours, "overloaded_minutes": overload}  # fmt: skip


def _hpa(workload: str, target: float, task_hours: float, overload: float) -> dict[str, Any]:
    return _row(
        workload, "hpa", {"target_utilisation": target, "downscale_window_s": 300.0}, task_hours, overload
    )


def _ap(workload: str, target: float, task_hours: float, overload: float) -> dict[str, Any]:
    setting = {"target_utilisation": target, "horizon_h": 72.0, "deferral_h": 48.0}
    return _row(workload, "autopilot-cpu", setting, task_hours, overload)


def test_setting_labels_name_each_knob() -> None:
    assert setting_label(
        "autopilot-cpu", {"target_utilisation": 0.6, "horizon_h": 72.0, "deferral_h": 0.25}
    ) == ("autopilot-cpu r*=0.6 T=72h Td=0.25h")
    assert setting_label("hpa", {"target_utilisation": 0.7, "downscale_window_s": 300.0}) == (
        "hpa target=0.7 window=300s"
    )


def test_each_hpa_frontier_point_is_covered_or_its_nearest_misses_reported() -> None:
    hpa = [_hpa("w", 0.5, 100.0, 0.0), _hpa("w", 0.7, 80.0, 5.0), _hpa("w", 0.6, 90.0, 6.0)]  # 0.6 dominated
    autopilot = [_ap("w", 0.5, 104.0, 0.0), _ap("w", 0.7, 90.0, 4.0)]
    check = workload_frontier(hpa, autopilot)
    points = check["hpa_frontier"]
    assert [p["hpa"]["setting"]["target_utilisation"] for p in points] == [0.7, 0.5]
    missed, covered = points
    assert covered["covered"]
    assert covered["autopilot"]["task_hours"] == 104.0
    assert not missed["covered"]
    assert missed["autopilot"] is None
    # Within 84 task-h nobody; at no more than 5 min overload the cheapest is 90 task-h (1.125x).
    assert missed["least_overload_within_cost"] is None
    assert missed["least_task_hours_at_no_more_overload"]["task_hours"] == 90.0
    assert check["met"] is False
    assert [p["task_hours"] for p in check["autopilot_frontier"]] == [90.0, 104.0]


def test_report_is_met_only_when_every_workload_frontier_is_covered() -> None:
    rows = [
        _hpa("a", 0.6, 100.0, 1.0), _ap("a", 0.6, 101.0, 1.0),
        _hpa("b", 0.6, 50.0, 0.0), _ap("b", 0.6, 60.0, 0.0),
        _row("b", "bound", {"target_utilisation": 0.6}, 40.0, 0.0),
    ]  # fmt: skip
    report = frontier_report(rows)
    assert [w["met"] for w in report["workloads"]] == [True, False]
    assert report["met"] is False
    assert frontier_report(rows[:2])["met"] is True
    assert frontier_report([_hpa("a", 0.6, 100.0, 1.0)]) == {
        "cost_slack": 0.05, "workloads": [], "recommended": [], "met": None
    }  # fmt: skip


def test_goals_are_the_frontier_check_met_or_missed_per_workload() -> None:
    rows = [
        _hpa("a", 0.6, 100.0, 1.0), _hpa("a", 0.8, 70.0, 9.0),
        _ap("a", 0.6, 105.0, 1.0), _ap("a", 0.8, 73.0, 9.0),  # both covered, at exactly 1.05x
        _hpa("b", 0.6, 100.0, 0.0), _hpa("b", 0.8, 80.0, 4.0),
        _ap("b", 0.6, 104.0, 0.0), _ap("b", 0.8, 80.0, 4.5),  # b@80: no more than 4 min overload missed
    ]  # fmt: skip
    checked = frontier_goals(frontier_report(rows))
    assert [(g["workload"], g["met"], g["detail"]) for g in checked] == [
        ("a", True, "2 of 2 HPA frontier points covered"),
        ("b", False, "1 of 2 HPA frontier points covered"),
    ]
    assert checked[0]["goal"] == (
        "every HPA frontier point covered by an Autopilot setting within 5% of its task-hours "
        "at no more overloaded minutes"
    )
    assert frontier_goals(frontier_report([_hpa("a", 0.6, 100.0, 1.0)])) == []


def test_recommended_settings_rank_by_frontier_points_covered_over_all_workloads() -> None:
    rows = [
        _hpa("a", 0.6, 100.0, 1.0), _hpa("a", 0.8, 70.0, 9.0),
        _hpa("b", 0.6, 100.0, 0.0),
        _ap("a", 0.6, 102.0, 0.0), _ap("b", 0.6, 103.0, 0.0),  # covers a@100 and b@100
        _ap("a", 0.8, 72.0, 8.0), _ap("b", 0.8, 75.0, 2.0),  # covers a@70 only
    ]  # fmt: skip
    picks = recommended_settings(rows)
    assert [(p["setting"]["target_utilisation"], p["covers"], p["of"]) for p in picks] == [
        (0.6, 2, 3),
        (0.8, 1, 3),
    ]
    assert picks[0]["task_hours"] == pytest.approx(205.0)
