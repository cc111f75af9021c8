"""Plain data for the cell: machines, constraints, task shapes, tasks and jobs.

These frozen dataclasses are what the Borgmaster (or an offline study) hands to
the scheduling core; the per-machine state lives in :class:`cellpilot.schedule.cell.Cell`
as arrays. A job's tasks usually share one :class:`TaskShape` (Borg §2.3: most task
properties are the same across a job), which is also the key of an equivalence
class (§3.4).

Allocs (§2.4) are tasks whose shape has ``is_alloc=True``; the job of an alloc is
its alloc set. A task runs inside an alloc set when its shape names the set in
``alloc_set``; it then consumes the alloc's resources, not the machine's.

The names (distinct from the API-side specs in :mod:`cellpilot.borg.model`, which the
Borgmaster translates into these in :mod:`cellpilot.borg.scheduling_view` and
:mod:`cellpilot.borg.cell_state`):

* :class:`CellMachine` – a machine as the scheduler sees it: capacity, attributes, rack
  and power domain.
* :class:`PlacementConstraint` – a hard or soft predicate on a machine attribute.
* :class:`TaskShape` – what placement depends on; shared by a job's tasks.
* :class:`PlacementTask` – one task (or alloc) to place: job, index, user, shape.
* :class:`PlacementJob` – a job (or alloc set) for admission control: a task count and a shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from cellpilot.job_vocabulary import AppClass, PriorityBand
from cellpilot.schedule.priority import band_of, check_priority, is_prod
from cellpilot.schedule.resources import Resources

ConstraintValue = str | float | tuple[str, ...]
CONSTRAINT_OPS = ("==", "!=", "<", ">", "in", "not-in")


@dataclass(frozen=True)
class PlacementConstraint:
    """A constraint on a machine attribute (Borg §2.3): hard ones filter, soft ones score.

    ``op`` is one of ``==``, ``!=``, ``<``, ``>`` (numeric), ``in`` and ``not-in``
    (a tuple of strings). A machine without the attribute satisfies only ``!=``
    and ``not-in``.
    """

    attribute: str
    op: str
    value: ConstraintValue
    hard: bool = True
    weight: float = 1.0  # relative weight among soft constraints

    def __post_init__(self) -> None:
        if self.op not in CONSTRAINT_OPS:
            raise ValueError(f"constraint op must be one of {CONSTRAINT_OPS}, got {self.op!r}")
        if self.op in ("in", "not-in") and not isinstance(self.value, tuple):
            raise ValueError(f"constraint {self.op!r} needs a tuple of values")
        if self.op in ("<", ">") and not isinstance(self.value, int | float):
            raise ValueError(f"constraint {self.op!r} needs a number")
        if self.weight <= 0:
            raise ValueError("constraint weight must be > 0")

    def describe(self) -> str:
        kind = "" if self.hard else "soft "
        return f"{kind}{self.attribute} {self.op} {self.value!r}"


@dataclass(frozen=True)
class CellMachine:
    """A machine: capacity, attributes for constraints and its failure domains (§2.2, §4)."""

    name: str
    capacity: Resources
    rack: str = "rack-0"
    power_domain: str = "power-0"
    attributes: tuple[tuple[str, str | float], ...] = ()

    @classmethod
    def build(
        cls,
        name: str,
        capacity: Resources,
        rack: str = "rack-0",
        power_domain: str = "power-0",
        attributes: Mapping[str, str | float] | None = None,
    ) -> CellMachine:
        return cls(name, capacity, rack, power_domain, tuple(sorted((attributes or {}).items())))


@dataclass(frozen=True)
class TaskShape:
    """Everything about a task that scheduling depends on: an equivalence class key (§3.4)."""

    priority: int
    limits: Resources
    app_class: AppClass = AppClass.BATCH
    constraints: tuple[PlacementConstraint, ...] = ()
    packages: tuple[str, ...] = ()
    alloc_set: str | None = None  # run inside an alloc of this alloc set (§2.4)
    is_alloc: bool = False  # this "task" is an alloc: it reserves ``limits`` on a machine
    # Instantaneous CPU usage model for the GPA fit test (GPA §4), in milli-cores.
    # Unknown: the task counts as a constant at its CPU limit.
    cpu_mean: float | None = None
    cpu_std: float | None = None

    def __hash__(self) -> int:
        # Shapes key the scheduler's caches (one lookup per task): hash the fields once.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, object]:
        # The cached hash is per process (string hashing is salted): never pickle it.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __post_init__(self) -> None:
        check_priority(self.priority)
        if self.is_alloc and self.alloc_set is not None:
            raise ValueError("an alloc cannot itself run inside an alloc set")
        if (self.cpu_mean is None) != (self.cpu_std is None):
            raise ValueError("cpu_mean and cpu_std go together")
        if self.cpu_mean is not None and (self.cpu_mean < 0 or (self.cpu_std or 0.0) < 0):
            raise ValueError("cpu_mean and cpu_std must be >= 0")

    @property
    def band(self) -> PriorityBand:
        return band_of(self.priority)

    @property
    def prod(self) -> bool:
        return is_prod(self.priority)

    @property
    def hard_constraints(self) -> tuple[PlacementConstraint, ...]:
        return tuple(c for c in self.constraints if c.hard)

    @property
    def soft_constraints(self) -> tuple[PlacementConstraint, ...]:
        return tuple(c for c in self.constraints if not c.hard)


@dataclass(frozen=True)
class PlacementTask:
    """One task of a job (or one alloc of an alloc set)."""

    job: str
    index: int
    user: str
    shape: TaskShape
    # A reservation restored from a checkpoint (§5.5); ``None``: it starts at the limit.
    reservation: Resources | None = None
    task_id: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.task_id:
            object.__setattr__(self, "task_id", f"{self.job}/{self.index}")

    @property
    def priority(self) -> int:
        return self.shape.priority


@dataclass(frozen=True)
class PlacementJob:
    """A job (or alloc set): a name, an owner, a task count and the tasks' shape (§2.3)."""

    name: str
    user: str
    task_count: int
    shape: TaskShape

    def __post_init__(self) -> None:
        if self.task_count < 0:
            raise ValueError("task_count must be >= 0")

    @property
    def priority(self) -> int:
        return self.shape.priority

    def tasks(self) -> list[PlacementTask]:
        return [PlacementTask(self.name, i, self.user, self.shape) for i in range(self.task_count)]
