"""Cost-against-harm frontiers: which settings no other setting beats on both, and whether one
family of settings covers another's frontier.

A point is (cost, harm), both to be kept low (e.g. task-hours and overloaded minutes of an
autoscaler setting). Point a *dominates* b when a is no worse on both and better on one. The
Pareto frontier of a set is its points no other point dominates. A candidate *covers* a
frontier point p within a cost slack s when its cost is at most (1 + s) x p's cost and its harm
at most p's harm.
"""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, float]
HARM_EPSILON = 1e-9  # harms this close count as equal (means over seeds of half-minute counts)


def dominates(a: Point, b: Point) -> bool:
    """a is no worse than b on cost and harm, and better on at least one."""
    no_worse = a[0] <= b[0] and a[1] <= b[1] + HARM_EPSILON
    return no_worse and (a[0] < b[0] or a[1] < b[1] - HARM_EPSILON)


def pareto_frontier(points: Sequence[Point]) -> list[int]:
    """Indices of the points no other point dominates, by increasing cost (then harm, then
    index); of identical points only the first is kept."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    frontier: list[int] = []
    least_harm = float("inf")
    for i in order:
        if points[i][1] < least_harm - HARM_EPSILON:  # cheaper points all do more harm
            frontier.append(i)
            least_harm = points[i][1]
    return frontier


def covering(target: Point, candidates: Sequence[Point], cost_slack: float) -> list[int]:
    """Indices of the candidates within ``cost_slack`` (a fraction) of ``target``'s cost at no
    more harm, the least harm first (then the least cost)."""
    if cost_slack < 0:
        raise ValueError("the cost slack must be non-negative")
    found = [
        i
        for i, (cost, harm) in enumerate(candidates)
        if cost <= (1.0 + cost_slack) * target[0] and harm <= target[1] + HARM_EPSILON
    ]
    return sorted(found, key=lambda i: (candidates[i][1], candidates[i][0], i))


def nearest_misses(
    target: Point, candidates: Sequence[Point], cost_slack: float
) -> tuple[int | None, int | None]:
    """For a target nobody covers, how close the candidates come: (the least-harm candidate
    within the cost slack, the least-cost candidate at no more harm); None where there is none."""
    within_cost = [i for i, (cost, _) in enumerate(candidates) if cost <= (1.0 + cost_slack) * target[0]]
    no_more_harm = [i for i, (_, harm) in enumerate(candidates) if harm <= target[1] + HARM_EPSILON]
    least_harm = min(within_cost, key=lambda i: (candidates[i][1], candidates[i][0], i), default=None)
    least_cost = min(no_more_harm, key=lambda i: (candidates[i][0], candidates[i][1], i), default=None)
    return least_harm, least_cost
