"""The scheduler's extension points: one small Protocol each (DESIGN rule 5).

* :class:`Filter` – which candidate machines can take the task (feasibility, Borg §3.2),
  and, for "why pending?", how many machines each reason excludes.
* :class:`Scorer` – how good each feasible machine is, on a fixed 0–100 scale,
  computed for an array of machines at once.
* :class:`Preemptor` – which lower-priority tasks to evict on the chosen machine.

Plugins are registered by name; :func:`build_plugin` validates the arguments when it
builds one (unknown names, unknown arguments and out-of-range values are errors at
build time, never during scheduling). "Does not fit" is a returned value, not an
exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from cellpilot.array_types import BoolArray, FloatArray, IntpArray
from cellpilot.schedule.cell import (
    COUNT,
    CPU_MEAN,
    CPU_VAR,
    LIMIT,
    NUM_CHANNELS,
    RESERVATION,
    Cell,
    placement_basis,
)
from cellpilot.schedule.model import PlacementConstraint, TaskShape
from cellpilot.schedule.priority import preemption_threshold
from cellpilot.schedule.resources import CPU

MIN_SCORE, MAX_SCORE = 0.0, 100.0


@dataclass
class Request:
    """A task shape compiled to arrays once per equivalence class."""

    shape: TaskShape
    limits: FloatArray  # (R,)
    amount: FloatArray  # (K,) channels the task adds to a machine
    priority: int
    threshold: int  # tasks below this priority level may be preempted
    basis: slice  # LIMIT for prod, RESERVATION for non-prod (§5.5)
    prod: bool
    hard: tuple[PlacementConstraint, ...]
    soft: tuple[PlacementConstraint, ...]
    job: int = -1  # job code of the task being placed (set per task)

    @classmethod
    def compile(cls, shape: TaskShape) -> Request:
        limits = shape.limits.array()
        amount = np.zeros(NUM_CHANNELS)
        amount[LIMIT] = limits
        amount[RESERVATION] = limits  # a new task's reservation starts at its limit (§5.5)
        if shape.cpu_mean is None:
            amount[CPU_MEAN] = limits[CPU]
        else:
            amount[CPU_MEAN], amount[CPU_VAR] = shape.cpu_mean, (shape.cpu_std or 0.0) ** 2
        amount[COUNT] = 1.0
        return cls(
            shape=shape,
            limits=limits,
            amount=amount,
            priority=shape.priority,
            threshold=preemption_threshold(shape.priority),
            basis=placement_basis(shape.priority),
            prod=shape.prod,
            hard=shape.hard_constraints,
            soft=shape.soft_constraints,
        )


class Filter(Protocol):
    @property
    def name(self) -> str: ...

    def feasible(self, cell: Cell, req: Request, machines: IntpArray) -> BoolArray:
        """Mask over ``machines``: True where the task can run (possibly after preemption)."""
        ...

    def exclusions(self, cell: Cell, req: Request, machines: IntpArray) -> dict[str, BoolArray]:
        """Per reason, the mask of ``machines`` that this filter excludes for that reason."""
        ...


class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def job_dependent(self) -> bool:
        """True when the score depends on the job being placed (not only on the machine
        and the task shape): such scores are recomputed for every task, never cached."""
        ...

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        """Scores in [0, 100] for ``machines`` (higher is better)."""
        ...


FitCheck = Callable[[FloatArray, FloatArray, Request], BoolArray]


class Preemptor(Protocol):
    @property
    def name(self) -> str: ...

    def victims(self, cell: Cell, req: Request, machine: int, fits: FitCheck) -> IntpArray | None:
        """Task handles to evict so the task fits on ``machine`` (empty: it fits already).

        ``fits(capacity, used, req)`` is the profile's fit test over rows of machines.
        ``None`` means that even evicting every task it may preempt is not enough.
        """
        ...


# ---------------------------------------------------------------------- registry
_REGISTRY: dict[str, dict[str, type]] = {"filter": {}, "scorer": {}, "preemptor": {}}


class Plugin:
    """Base for plugin dataclasses; :func:`register` sets the ``kind`` and ``name`` they are known by."""

    kind: ClassVar[str]
    name: ClassVar[str]


PluginT = TypeVar("PluginT", bound=Plugin)


def register(kind: str, name: str) -> Callable[[type[PluginT]], type[PluginT]]:
    def decorate(cls: type[PluginT]) -> type[PluginT]:
        if name in _REGISTRY[kind]:
            raise ValueError(f"{kind} {name!r} registered twice")
        cls.kind, cls.name = kind, name
        _REGISTRY[kind][name] = cls
        return cls

    return decorate


def registered(kind: str) -> list[str]:
    return sorted(_REGISTRY[kind])


def plugin_class(kind: str, name: str) -> type:
    """The class registered as ``name`` of ``kind`` (what it reads, before building one)."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown plugin kind {kind!r}")
    cls = _REGISTRY[kind].get(name)
    if cls is None:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(registered(kind))}")
    return cls


def build_plugin(kind: str, name: str, args: Mapping[str, Any] | None = None) -> Any:
    """Builds a registered plugin, validating its arguments against its dataclass fields."""
    cls = plugin_class(kind, name)
    given = dict(args or {})
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ValueError(f"{kind} {name!r} has no argument(s) {unknown}; it takes {sorted(fields)}")
    for key, value in given.items():
        expected = fields[key].type
        if expected in ("float", float) and isinstance(value, int) and not isinstance(value, bool):
            given[key] = float(value)
        elif expected in ("float", float) and not isinstance(value, float):
            raise ValueError(f"{kind} {name!r}: argument {key!r} must be a number, got {value!r}")
        elif expected in ("bool", bool) and not isinstance(value, bool):
            raise ValueError(f"{kind} {name!r}: argument {key!r} must be true or false, got {value!r}")
        elif expected in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{kind} {name!r}: argument {key!r} must be an integer, got {value!r}")
    return cls(**given)  # the dataclass's __post_init__ checks ranges
