"""A plain, literal evaluation of Autopilot eqs. 4-9, one model and one limit at a time.

Independent of the vectorised implementation: o(L) and u(L) are kept per model and per
limit exactly as eqs. 4-5 define them (no smoothed-histogram shortcut), every arg-min
scans all candidates and takes the first minimum.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Params:
    decays: tuple[float, ...]  # d_m per model
    margins: tuple[float, ...]  # M_m per model
    additive: bool
    d: float
    w_o: float
    w_u: float
    w_dl: float
    w_dm: float
    normalise: bool
    at_previous: bool


def first_argmin(values: list[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v < values[best]:
            best = i
    return best


def brute_force(boundaries: list[float], histograms: list[list[float]], p: Params) -> list[tuple[int, float]]:
    """(chosen model m[t], recommended limit L[t]) after each histogram."""
    k_count, models = len(boundaries), len(p.decays)
    o = [[0.0] * k_count for _ in range(models)]
    u = [[0.0] * k_count for _ in range(models)]
    prev_raw: list[int | None] = [None] * models
    cost = [0.0] * models
    prev_model: int | None = None
    prev_final: float | None = None
    out = []

    def limit_of(m: int, k: int) -> float:
        return boundaries[k] + p.margins[m] if p.additive else boundaries[k] * (1.0 + p.margins[m])

    def over(s: list[float], limit: float) -> float:
        return sum(s[j] for j in range(k_count) if boundaries[j] > limit)

    def under(s: list[float], limit: float) -> float:
        return sum(s[j] for j in range(k_count) if boundaries[j] < limit)

    for raw in histograms:
        total = sum(raw)
        s = (
            [x / total for x in raw]
            if p.normalise and total > 0
            else ([0.0] * k_count if p.normalise else raw)
        )
        new_raw: list[int] = []
        for m in range(models):
            dm = p.decays[m]
            for k, limit in enumerate(boundaries):
                o[m][k] = (1 - dm) * o[m][k] + dm * over(s, limit)  # eq. 4
                u[m][k] = (1 - dm) * u[m][k] + dm * under(s, limit)  # eq. 5
            penalised = [
                p.w_o * o[m][k] + p.w_u * u[m][k] + (0.0 if prev_raw[m] in (None, k) else p.w_dl)
                for k in range(k_count)
            ]  # eq. 6
            new_raw.append(first_argmin(penalised))
        limits = [limit_of(m, new_raw[m]) for m in range(models)]  # eq. 7
        for m in range(models):
            previous = prev_raw[m]
            at = limit_of(m, previous) if p.at_previous and previous is not None else limits[m]
            changed = previous is not None and new_raw[m] != previous
            cost[m] = (
                p.d * (p.w_o * over(s, at) + p.w_u * under(s, at) + p.w_dl * changed) + (1 - p.d) * cost[m]
            )
        scores = [
            cost[m]
            + (p.w_dm if prev_model is not None and m != prev_model else 0.0)
            + (p.w_dl if prev_final is not None and limits[m] != prev_final else 0.0)
            for m in range(models)
        ]  # eq. 9, with L[t-1] for the circular L[t]
        chosen = first_argmin(scores)
        prev_raw = list(new_raw)
        prev_model, prev_final = chosen, limits[chosen]
        out.append((chosen, limits[chosen]))
    return out
