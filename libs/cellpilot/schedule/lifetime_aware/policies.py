"""Placement policies as data, registered by name (LAVA §2.2, §4.2-4.3, §5.3).

Every policy chooses a host by a lexicographic list of levels (§2.2), packing always
last; a policy is the registered scorers (:mod:`.borg_scorers`) it stacks right above
packing, highest first. What it needs follows from what those scorers read:

* ``best-fit``: packing alone, the baseline scheduler (§2.4, §5.3);
* ``la-binary`` (§2.4, §5.3): LA-Binary's short/long preference from one-shot
  predictions (never repredicted) above packing;
* ``las`` (§4.2): LAS's temporal cost, from repredicted exit times, one level above packing;
* ``lava`` (§4.3): LAVA's host preference above LAS; it keeps LAVA's host states.

The Borg scheduler (:func:`cellpilot.schedule.profile.default_profile`, the Borgmaster's
``placement_policy``) and the LAVA study (:mod:`.pool_placement`, ``cellpilot eval lava``)
both look policies up here and build the same scorer plugins from them, so a new policy
is one :func:`register_placement` call below. The scheduler runs the policies its cell's
source gives what they need (:data:`~.borg_scorers.CELL_SOURCE_GIVES`; LA-Binary's
one-shot predictions are kept by the study only).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from cellpilot.schedule.lifetime_aware.borg_scorers import LifetimeLevel, Reads
from cellpilot.schedule.plugins import plugin_class

BASELINE = "best-fit"  # the policy the others are compared with (§5.3)


@dataclass(frozen=True)
class PlacementPolicy:
    """A placement policy: the registered lifetime-aware scorers it stacks above packing."""

    name: str
    levels: tuple[str, ...] = ()  # scorer names, highest first
    needs: frozenset[Reads] = field(init=False, default=frozenset())  # what its levels read

    def __post_init__(self) -> None:
        needs: set[Reads] = set()
        for level in self.levels:
            cls = plugin_class("scorer", level)
            if not issubclass(cls, LifetimeLevel):
                raise ValueError(f"placement policy {self.name!r}: scorer {level!r} is not lifetime-aware")
            needs |= cls.reads
        object.__setattr__(self, "needs", frozenset(needs))

    @property
    def needs_lifetimes(self) -> bool:
        """True when its levels read a source of lifetime predictions (a model or an oracle)."""
        return bool(self.needs)

    @property
    def keeps_host_states(self) -> bool:
        """True when its levels read LAVA's host states (§4.3), which must then be kept."""
        return Reads.HOST_STATES in self.needs


_POLICIES: dict[str, PlacementPolicy] = {}


def register_placement(policy: PlacementPolicy) -> PlacementPolicy:
    if policy.name in _POLICIES:
        raise ValueError(f"placement policy {policy.name!r} registered twice")
    _POLICIES[policy.name] = policy
    return policy


def placement_names(given: Collection[Reads] | None = None) -> tuple[str, ...]:
    """Registered policies in registration order; with ``given``, only those whose needs it covers."""
    return tuple(p.name for p in _POLICIES.values() if given is None or p.needs <= set(given))


def placement_policy(name: str, given: Collection[Reads] | None = None) -> PlacementPolicy:
    """The policy registered as ``name``; with ``given``, it must need no more than that."""
    names = placement_names(given)
    policy = _POLICIES.get(name)
    if policy is None:
        raise ValueError(f"placement policy must be one of {', '.join(names)}; got {name!r}")
    if name not in names:
        missing = ", ".join(sorted(r.value for r in policy.needs - set(given or ())))
        raise ValueError(
            f"placement policy must be one of {', '.join(names)}; got {name!r}, which needs {missing}"
        )
    return policy


register_placement(PlacementPolicy(BASELINE))
register_placement(PlacementPolicy("la-binary", ("la-binary",)))
register_placement(PlacementPolicy("las", ("las",)))
register_placement(PlacementPolicy("lava", ("lava", "las")))
