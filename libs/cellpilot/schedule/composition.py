"""Composing scorers: by weight, and lexicographically (Borg §3.2; LAVA §2.2, §4.2).

Borg's scoring is lexicographic: one criterion at a time, ties broken by the next
(LAVA §2.2). A :class:`Level` compares its scores after flooring them to multiples of
``quantum``, which creates the ties that let lower levels decide; LAS (LAVA §4.2)
slots in as one more level above bin packing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cellpilot.array_types import FloatArray, IntpArray
from cellpilot.schedule.cell import Cell
from cellpilot.schedule.plugins import MAX_SCORE, Request, Scorer

_TIE = 1e-9
_LEXSORT_ROWS = 128  # below this, one lexsort beats filtering level by level


@dataclass(frozen=True)
class Weighted:
    """Weighted mean of several scorers; still on the 0–100 scale."""

    parts: tuple[tuple[Scorer, float], ...]
    label: str = "weighted"

    @property
    def name(self) -> str:
        return self.label

    def __post_init__(self) -> None:
        if not self.parts or any(w <= 0 for _, w in self.parts):
            raise ValueError("a weighted score needs parts with weights > 0")

    @property
    def job_dependent(self) -> bool:
        return any(s.job_dependent for s, _ in self.parts)

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        total = sum(w for _, w in self.parts)
        parts = iter(self.parts)
        scorer, weight = next(parts)
        out = scorer.score(cell, req, machines) * (weight / total)
        for scorer, weight in parts:
            out += scorer.score(cell, req, machines) * (weight / total)
        return out


@dataclass(frozen=True)
class Level:
    scorer: Scorer
    quantum: float = 0.0  # > 0: compare floor(score / quantum), so near-equal scores tie

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantum <= MAX_SCORE:
            raise ValueError("quantum must be in [0, 100]")


@dataclass(frozen=True)
class Lexicographic:
    """Levels compared in order; a later level only breaks ties of the earlier ones."""

    levels: tuple[Level, ...]

    job_columns: tuple[int, ...] = field(init=False, default=())  # levels recomputed for every task

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("lexicographic scoring needs at least one level")
        columns = tuple(i for i, level in enumerate(self.levels) if level.scorer.job_dependent)
        object.__setattr__(self, "job_columns", columns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(level.scorer.name for level in self.levels)

    def machine_levels(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        """The cacheable part: every level that does not depend on the job (others NaN)."""
        out = np.full((machines.shape[0], len(self.levels)), np.nan)
        for i, level in enumerate(self.levels):
            if not level.scorer.job_dependent:
                out[:, i] = level.scorer.score(cell, req, machines)
        return out

    def fill_job_levels(self, cell: Cell, req: Request, machines: IntpArray, matrix: FloatArray) -> None:
        for i in self.job_columns:
            matrix[:, i] = self.levels[i].scorer.score(cell, req, machines)

    def all_levels(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        matrix = self.machine_levels(cell, req, machines)
        self.fill_job_levels(cell, req, machines, matrix)
        return matrix

    def keys(self, matrix: FloatArray) -> list[FloatArray]:
        """Per level, the values compared: floor(score / quantum), or the score rounded to 1e-9."""
        out = []
        for i, level in enumerate(self.levels):
            column = matrix[:, i]
            out.append(
                np.floor(column * (1.0 / level.quantum) + _TIE) if level.quantum > 0 else column.round(9)
            )
        return out

    def select(self, matrix: FloatArray) -> int:
        """Row of the best machine; ties after the last level go to the first row."""
        keys = self.keys(matrix)
        if matrix.shape[0] <= _LEXSORT_ROWS:
            # One stable sort: the first row among the best keeps ties in row order.
            return int(np.lexsort([-k for k in reversed(keys)])[0])
        candidates: IntpArray | None = None
        for key in keys:
            column = key if candidates is None else key[candidates]
            keep = (column == column.max()).nonzero()[0]
            candidates = keep if candidates is None else candidates[keep]
            if candidates.size == 1:
                break
        assert candidates is not None
        return int(candidates[0])
