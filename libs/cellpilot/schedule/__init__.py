"""Borg's scheduling core (Borg §2.3–2.5, §3.2, §3.4, §5.5) and the GPA fit test (GPA §4).

Pure, numpy-vectorised library: the Borgmaster holds a :class:`Cell` and a
:class:`Scheduler` and calls them with plain dataclasses; offline studies drive the
same code directly.

* :mod:`.model` – machines, constraints, task shapes, tasks, jobs (allocs are tasks).
* :mod:`.cell` – the cell as struct-of-arrays with incremental updates.
* :mod:`.quota` – admission control per user and priority band.
* :mod:`.reservation` – resource reclamation (reservations from usage).
* :mod:`.plugins`, :mod:`.filters`, :mod:`.scorers`, :mod:`.composition`,
  :mod:`.preemption`, :mod:`.profile` – the pluggable feasibility / scoring / preemption.
* :mod:`.scheduler` – the scheduling pass with equivalence classes, score caching and
  relaxed randomisation.
* :mod:`.why_pending` – "why pending?" explanations.
* :mod:`.gpa` – Gaussian Percentile Approximation bin packing and the §5.1 baselines.
"""

from cellpilot.schedule.cell import Cell, ResizeOutcome, placement_basis
from cellpilot.schedule.composition import Level, Lexicographic, Weighted
from cellpilot.schedule.filters import HardConstraints, ResourceFit
from cellpilot.schedule.gpa import Packing, gaussian_fits, gaussian_z, overflow_probability, pack
from cellpilot.schedule.model import CellMachine, PlacementConstraint, PlacementJob, PlacementTask, TaskShape
from cellpilot.schedule.plugins import Filter, Preemptor, Request, Scorer, build_plugin, registered
from cellpilot.schedule.preemption import LowestPriorityFirst
from cellpilot.schedule.priority import NUM_PRIORITIES, band_of, is_prod, may_preempt, preemption_threshold
from cellpilot.schedule.profile import Profile, build_profile, default_profile, packing_profile
from cellpilot.schedule.quota import Admitted, QuotaBook, Rejected
from cellpilot.schedule.reservation import ReclamationParams, initial_reservation, next_reservation
from cellpilot.schedule.resources import RESOURCE_NAMES, Resources
from cellpilot.schedule.scheduler import (
    PassResult,
    Placement,
    Scheduler,
    SchedulerConfig,
    Unschedulable,
    pending_order,
    priority_round_robin,
)
from cellpilot.schedule.scorers import (
    BestFit,
    FailureDomainSpread,
    HybridStranding,
    PackageLocality,
    PreemptionCost,
    PriorityMixing,
    SoftConstraints,
    WorstFit,
)
from cellpilot.schedule.why_pending import PendingExplanation, RequestChange, explain_pending

__all__ = [
    "NUM_PRIORITIES",
    "RESOURCE_NAMES",
    "Admitted",
    "BestFit",
    "Cell",
    "CellMachine",
    "FailureDomainSpread",
    "Filter",
    "HardConstraints",
    "HybridStranding",
    "Level",
    "Lexicographic",
    "LowestPriorityFirst",
    "PackageLocality",
    "Packing",
    "PassResult",
    "PendingExplanation",
    "Placement",
    "PlacementConstraint",
    "PlacementJob",
    "PlacementTask",
    "PreemptionCost",
    "Preemptor",
    "PriorityMixing",
    "Profile",
    "QuotaBook",
    "ReclamationParams",
    "Rejected",
    "Request",
    "RequestChange",
    "ResizeOutcome",
    "ResourceFit",
    "Resources",
    "Scheduler",
    "SchedulerConfig",
    "Scorer",
    "SoftConstraints",
    "TaskShape",
    "Unschedulable",
    "Weighted",
    "WorstFit",
    "band_of",
    "build_plugin",
    "build_profile",
    "default_profile",
    "explain_pending",
    "gaussian_fits",
    "gaussian_z",
    "initial_reservation",
    "is_prod",
    "may_preempt",
    "next_reservation",
    "overflow_probability",
    "pack",
    "packing_profile",
    "pending_order",
    "placement_basis",
    "preemption_threshold",
    "priority_round_robin",
    "registered",
]
