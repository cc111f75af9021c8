"""Machine attributes as columns, and constraints evaluated over many machines at once.

Borg jobs constrain their tasks to machines with particular attributes (processor
architecture, OS version, external IP, ...; Borg §2.3). Each attribute is one
column over machines: numeric columns hold floats (NaN when a machine lacks the
attribute), string columns hold integer codes into a vocabulary (-1 when missing).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, IntpArray
from cellpilot.schedule.model import PlacementConstraint

MISSING_CODE = -1


class AttributeColumn:
    def __init__(self, numeric: bool, size: int) -> None:
        self.numeric = numeric
        self.codes: dict[str, int] = {}
        self.values: npt.NDArray[np.float64] | npt.NDArray[np.int32]
        if numeric:
            self.values = np.full(size, np.nan, dtype=np.float64)
        else:
            self.values = np.full(size, MISSING_CODE, dtype=np.int32)

    def grow(self, size: int) -> None:
        old = self.values
        if self.numeric:
            self.values = np.full(size, np.nan, dtype=np.float64)
        else:
            self.values = np.full(size, MISSING_CODE, dtype=np.int32)
        self.values[: old.shape[0]] = old

    def code(self, value: str) -> int:
        return self.codes.setdefault(value, len(self.codes))


class AttributeTable:
    """Per-machine attribute columns, sized to the cell's machine capacity."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.columns: dict[str, AttributeColumn] = {}

    def grow(self, size: int) -> None:
        self.size = size
        for column in self.columns.values():
            column.grow(size)

    def set(self, machine: int, name: str, value: str | float) -> None:
        numeric = not isinstance(value, str)
        column = self.columns.get(name)
        if column is None:
            column = self.columns[name] = AttributeColumn(numeric, self.size)
        if column.numeric != numeric:
            raise ValueError(f"attribute {name!r} mixes numbers and strings")
        if numeric:
            column.values[machine] = float(value)
        else:
            column.values[machine] = column.code(str(value))

    def clear(self, machine: int) -> None:
        for column in self.columns.values():
            column.values[machine] = np.nan if column.numeric else MISSING_CODE

    def get(self, machine: int, name: str) -> str | float | None:
        column = self.columns.get(name)
        if column is None:
            return None
        raw = column.values[machine]
        if column.numeric:
            value = float(raw)
            return None if math.isnan(value) else value
        code = int(raw)
        if code == MISSING_CODE:
            return None
        return next(k for k, v in column.codes.items() if v == code)

    def satisfies(self, constraint: PlacementConstraint, machines: IntpArray) -> BoolArray:
        """Which of ``machines`` satisfy ``constraint`` (hard or soft alike)."""
        column = self.columns.get(constraint.attribute)
        negative = constraint.op in ("!=", "not-in")
        if column is None:
            return np.full(machines.shape[0], negative, dtype=bool)
        values = column.values[machines]
        op, target = constraint.op, constraint.value
        if column.numeric:
            if op in ("<", ">"):
                bound = float(target)  # type: ignore[arg-type]
                return values < bound if op == "<" else values > bound
            if op in ("in", "not-in"):
                wanted = np.array([float(v) for v in target], dtype=np.float64)  # type: ignore[union-attr]
                hit = np.isin(values, wanted)
            else:
                hit = np.asarray(values == float(target))  # type: ignore[arg-type]
            return ~hit if negative else hit
        if op in ("<", ">"):
            return np.zeros(machines.shape[0], dtype=bool)
        if op in ("in", "not-in"):
            codes = [column.codes[v] for v in target if v in column.codes]  # type: ignore[union-attr]
            hit = np.isin(values, np.array(codes, dtype=np.int32))
        else:
            code = column.codes.get(str(target), -2)
            hit = np.asarray(values == code)
        return ~hit if negative else hit

    def nbytes(self) -> int:
        return sum(c.values.nbytes for c in self.columns.values())
