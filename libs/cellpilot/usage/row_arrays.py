"""Tables kept as parallel numpy arrays: a dataclass whose every field holds one entry per row.

Raw sample chunks, per-(task, window) statistics and per-(job, day) metrics are such tables;
:class:`RowArrays` gives them one way to count, filter and stack their rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any, Self

import numpy as np
import numpy.typing as npt


class RowArrays:
    """Mixin for a dataclass of 1-d arrays of equal length (one entry per row in each field)."""

    def __len__(self) -> int:
        return int(getattr(self, _field_names(self)[0]).shape[0])

    def select(self, mask: npt.NDArray[np.bool_]) -> Self:
        """The rows where ``mask`` is true (order kept)."""
        return type(self)(**{name: getattr(self, name)[mask] for name in _field_names(self)})

    @classmethod
    def empty(cls) -> Self:
        raise NotImplementedError

    @classmethod
    def concat(cls, parts: Sequence[Self]) -> Self:
        """The rows of every part, in order (:meth:`empty` when there are none)."""
        if not parts:
            return cls.empty()
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in _field_names(cls)})


def _field_names(table: Any) -> list[str]:
    return [f.name for f in fields(table)]
