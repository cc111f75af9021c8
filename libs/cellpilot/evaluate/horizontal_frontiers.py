"""Autopilot against the HPA's frontier of task-hours and overloaded minutes.

Autopilot keeps capacity on purpose (§3.3: a 72 h horizon, deferred downscaling), so comparing
one setting of each with "fewer task-hours" asks the wrong question. Instead each decider is
replayed at many settings of its knobs (:class:`cellpilot.evaluate.horizontal_config.SweepGrid`)
and, per workload, the HPA's settings no other HPA setting beats on both task-hours and
overloaded minutes form its frontier (:func:`cellpilot.evaluate.frontier.pareto_frontier`). The
goal: every point of that frontier is *covered* by some Autopilot setting, within 5 % of its
task-hours at no more overloaded minutes (:func:`cellpilot.evaluate.frontier.covering`).

The functions here take the study's rows (means over seeds, one per workload, decider and
setting) and return plain data for ``horizontal.json`` and the report; :func:`frontier_goals`
turns the check into the study's goal rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cellpilot.evaluate.frontier import covering, nearest_misses, pareto_frontier
from cellpilot.evaluate.horizontal_config import AUTOPILOT

COST_SLACK = 0.05  # an Autopilot setting may use up to 5 % more task-hours than the HPA's point
HPA = "hpa"
AUTOPILOT_DECIDERS = AUTOPILOT
_LABELS = {
    "target_utilisation": ("r*=", "{:g}"),
    "horizon_h": ("T=", "{:g}h"),
    "deferral_h": ("Td=", "{:g}h"),
    "downscale_window_s": ("window=", "{:g}s"),
}


def setting_label(decider: str, setting: Mapping[str, float]) -> str:
    """A short name for a decider at a setting, e.g. ``autopilot-cpu r*=0.6 T=72h Td=48h``."""
    parts = [
        ("target=" if decider == HPA and k == "target_utilisation" else _LABELS[k][0])
        + _LABELS[k][1].format(v)
        for k, v in setting.items()
        if k in _LABELS
    ]
    return " ".join([decider, *parts])


def _point(row: Mapping[str, Any]) -> tuple[float, float]:
    return float(row["task_hours"]), float(row["overloaded_minutes"])


def _brief(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "decider": row["decider"],
        "setting": dict(row["setting"]),
        "label": setting_label(row["decider"], row["setting"]),
        "task_hours": row["task_hours"],
        "overloaded_minutes": row["overloaded_minutes"],
    }


def workload_frontier(
    hpa_rows: Sequence[Mapping[str, Any]],
    autopilot_rows: Sequence[Mapping[str, Any]],
    cost_slack: float = COST_SLACK,
) -> dict[str, Any]:
    """One workload: the HPA's frontier, each point with the Autopilot setting that covers it
    (the one with the least overload) or, when none does, the nearest misses; and Autopilot's
    own frontier."""
    hpa_points = [_point(r) for r in hpa_rows]
    ap_points = [_point(r) for r in autopilot_rows]
    checks = []
    for i in pareto_frontier(hpa_points):
        found = covering(hpa_points[i], ap_points, cost_slack)
        least_harm, least_cost = nearest_misses(hpa_points[i], ap_points, cost_slack)
        checks.append(
            {
                "hpa": _brief(hpa_rows[i]),
                "covered": bool(found),
                "autopilot": _brief(autopilot_rows[found[0]]) if found else None,
                "covering": len(found),
                "least_overload_within_cost": _brief(
                    None if least_harm is None else autopilot_rows[least_harm]
                ),
                "least_task_hours_at_no_more_overload": _brief(
                    None if least_cost is None else autopilot_rows[least_cost]
                ),
            }
        )
    return {
        "hpa_frontier": checks,
        "autopilot_frontier": [_brief(autopilot_rows[i]) for i in pareto_frontier(ap_points)],
        "met": all(c["covered"] for c in checks) if checks else None,
    }


def recommended_settings(
    rows: Sequence[Mapping[str, Any]], cost_slack: float = COST_SLACK, top: int = 5
) -> list[dict[str, Any]]:
    """The Autopilot settings that cover the most HPA frontier points over all workloads (then
    the fewest overloaded minutes, then task-hours, summed over workloads): what a user who
    wants one setting should pick."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    targets = []
    for w in workloads:
        hpa = [_point(r) for r in rows if r["workload"] == w and r["decider"] == HPA]
        targets += [(w, hpa[i]) for i in pareto_frontier(hpa)]
    tally: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["decider"] not in AUTOPILOT_DECIDERS:
            continue
        label = setting_label(r["decider"], r["setting"])
        entry = tally.setdefault(
            label,
            {"label": label, "decider": r["decider"], "setting": dict(r["setting"]), "covers": 0,
             "task_hours": 0.0, "overloaded_minutes": 0.0, "workloads": 0},
        )  # fmt: skip
        entry["covers"] += sum(
            1 for w, p in targets if w == r["workload"] and covering(p, [_point(r)], cost_slack)
        )
        entry["task_hours"] += r["task_hours"]
        entry["overloaded_minutes"] += r["overloaded_minutes"]
        entry["workloads"] += 1
    complete = [e for e in tally.values() if e["workloads"] == len(workloads)]
    ranked = sorted(complete, key=lambda e: (-e["covers"], e["overloaded_minutes"], e["task_hours"]))
    return [{**e, "of": len(targets)} for e in ranked[:top]]


def frontier_report(rows: Sequence[Mapping[str, Any]], cost_slack: float = COST_SLACK) -> dict[str, Any]:
    """The frontier check of every workload that has HPA and Autopilot rows, and the settings to
    pick; ``met`` is None when no workload could be checked."""
    out: list[dict[str, Any]] = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        hpa = [r for r in rows if r["workload"] == w and r["decider"] == HPA]
        autopilot = [r for r in rows if r["workload"] == w and r["decider"] in AUTOPILOT_DECIDERS]
        if hpa and autopilot:
            out.append({"workload": w, **workload_frontier(hpa, autopilot, cost_slack)})
    return {
        "cost_slack": cost_slack,
        "workloads": out,
        "recommended": recommended_settings(rows, cost_slack) if out else [],
        "met": all(w["met"] for w in out) if out else None,
    }


def frontier_goals(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The horizontal goal, one row per workload of a :func:`frontier_report`: every point of the
    HPA's frontier covered by some Autopilot setting within ``cost_slack`` of its task-hours at
    no more overloaded minutes (met or missed, with how many points are covered)."""
    slack = float(report["cost_slack"])
    goal = (
        f"every HPA frontier point covered by an Autopilot setting within {slack:.0%} of its "
        "task-hours at no more overloaded minutes"
    )
    out = []
    for check in report["workloads"]:
        points = check["hpa_frontier"]
        covered = sum(1 for p in points if p["covered"])
        out.append(
            {
                "workload": check["workload"],
                "autopilot": "any setting of " + ", ".join(AUTOPILOT_DECIDERS),
                "goal": goal,
                "met": bool(check["met"]),
                "detail": f"{covered} of {len(points)} HPA frontier points covered",
            }
        )
    return out
