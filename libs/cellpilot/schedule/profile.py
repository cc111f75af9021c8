"""A scheduling profile: the filters, the lexicographic scoring and the preemptor in use.

Profiles are built from plain data (e.g. a YAML block of the Borgmaster's settings)
with :func:`build_profile`; every plugin's arguments are validated at build time.

Example::

    build_profile({
        "filters": ["hard-constraints", {"name": "resources", "args": {"gpa_rho": 0.01}}],
        "levels": [
            {"scorer": "preemption-cost"},
            {"weighted": [{"name": "spread", "weight": 2}, {"name": "soft-constraints"}], "quantum": 10},
            {"scorer": "hybrid"},
        ],
        "preemptor": "lowest-priority-first",
    })
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cellpilot.array_types import BoolArray, FloatArray
from cellpilot.schedule.composition import Level, Lexicographic, Weighted
from cellpilot.schedule.filters import HardConstraints, ResourceFit
from cellpilot.schedule.lifetime_aware.borg_scorers import CELL_SOURCE_GIVES, LifetimeSource
from cellpilot.schedule.lifetime_aware.policies import BASELINE, placement_names, placement_policy
from cellpilot.schedule.plugins import Filter, Preemptor, Request, Scorer, build_plugin
from cellpilot.schedule.preemption import LowestPriorityFirst
from cellpilot.schedule.scorers import (
    FailureDomainSpread,
    PackageLocality,
    PreemptionCost,
    PriorityMixing,
    SoftConstraints,
)


@dataclass(frozen=True)
class Profile:
    filters: tuple[Filter, ...]
    scoring: Lexicographic
    preemptor: Preemptor

    def __post_init__(self) -> None:
        fits = [f for f in self.filters if isinstance(f, ResourceFit)]
        if len(fits) != 1:
            raise ValueError("a profile needs exactly one 'resources' filter")

    @property
    def resource_fit(self) -> ResourceFit:
        return next(f for f in self.filters if isinstance(f, ResourceFit))

    def fits(self, capacity: FloatArray, used: FloatArray, req: Request) -> BoolArray:
        return self.resource_fit.fits(capacity, used, req)


# Placement policies (LAVA §5.3; registered in schedule/lifetime_aware/policies.py) that a cell's
# source of lifetimes serves: the baseline packs by the packing scorer alone; LAS (§4.2) adds its
# temporal cost one level above packing; LAVA (§4.3) its host preference above LAS.
PLACEMENT_POLICIES = placement_names(CELL_SOURCE_GIVES)


def lifetime_levels(placement: str, lifetimes: LifetimeSource | None) -> tuple[Level, ...]:
    """The registered scorers a placement policy puts right above packing (LAVA §4.2-4.3)."""
    policy = placement_policy(placement, CELL_SOURCE_GIVES)
    if policy.needs_lifetimes and lifetimes is None:
        raise ValueError(f"placement policy {placement!r} needs a source of lifetime predictions")
    return tuple(Level(build_plugin("scorer", name, {"lifetimes": lifetimes})) for name in policy.levels)


def default_profile(
    packing: str = "hybrid",
    gpa_rho: float = 0.0,
    placement: str = BASELINE,
    lifetimes: LifetimeSource | None = None,
) -> Profile:
    """Borg-like defaults (§3.2): fewest/lowest preemptions, then spreading across failure
    domains, then the remaining preferences, then the placement policy's lifetime levels
    (none for best-fit), then packing."""
    parts: tuple[tuple[Scorer, float], ...] = (
        (SoftConstraints(), 2.0),
        (PackageLocality(), 1.0),
        (PriorityMixing(), 0.5),
    )
    levels = (
        Level(PreemptionCost()),
        Level(FailureDomainSpread(), quantum=5.0),
        Level(Weighted(parts), quantum=10.0),
        *lifetime_levels(placement, lifetimes),
        Level(build_plugin("scorer", packing)),
    )
    return Profile(
        (HardConstraints(), ResourceFit(gpa_rho=gpa_rho)), Lexicographic(levels), LowestPriorityFirst()
    )


def packing_profile(packing: str, gpa_rho: float = 0.0) -> Profile:
    """Only what packing studies compare: preemption cost, soft constraints, then packing."""
    levels = (
        Level(PreemptionCost()),
        Level(SoftConstraints(), quantum=10.0),
        Level(build_plugin("scorer", packing)),
    )
    return Profile(
        (HardConstraints(), ResourceFit(gpa_rho=gpa_rho)), Lexicographic(levels), LowestPriorityFirst()
    )


def _named(item: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if isinstance(item, str):
        return item, {}
    unknown = set(item) - {"name", "args", "weight"}
    if unknown or "name" not in item:
        raise ValueError(f"a plugin entry needs 'name' (and optional 'args'), got {dict(item)}")
    return str(item["name"]), dict(item.get("args") or {})


def _level(item: Mapping[str, Any]) -> Level:
    quantum = float(item.get("quantum", 0.0))
    if "scorer" in item:
        name, args = str(item["scorer"]), dict(item.get("args") or {})
        return Level(build_plugin("scorer", name, args), quantum)
    if "weighted" in item:
        parts: list[tuple[Scorer, float]] = []
        for part in item["weighted"]:
            name, args = _named(part)
            weight = float(part.get("weight", 1.0)) if isinstance(part, Mapping) else 1.0
            parts.append((build_plugin("scorer", name, args), weight))
        return Level(Weighted(tuple(parts)), quantum)
    raise ValueError(f"a level needs 'scorer' or 'weighted', got {dict(item)}")


def build_profile(config: Mapping[str, Any]) -> Profile:
    unknown = set(config) - {"filters", "levels", "preemptor"}
    if unknown:
        raise ValueError(f"unknown profile keys {sorted(unknown)}")
    filters_cfg: Sequence[str | Mapping[str, Any]] = config.get("filters", ["hard-constraints", "resources"])
    filters = tuple(build_plugin("filter", *_named(f)) for f in filters_cfg)
    levels_cfg: Sequence[Mapping[str, Any]] = config.get("levels", [{"scorer": "hybrid"}])
    scoring = Lexicographic(tuple(_level(level) for level in levels_cfg))
    preemptor = build_plugin("preemptor", *_named(config.get("preemptor", "lowest-priority-first")))
    return Profile(filters, scoring, preemptor)
