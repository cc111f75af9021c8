"""Resource dimensions of a Borg machine or task request.

Borg specifies each resource dimension independently and at fine granularity
(Borg §2.3, §5.4): CPU in milli-cores, RAM and disk in bytes, plus TCP ports,
which Borg manages per machine (§2.3 footnote 2; we model them as a count).
Every per-machine and per-task array in :mod:`cellpilot.schedule` holds these
dimensions in this order along its last axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray
from cellpilot.units import GIB

RESOURCE_NAMES: tuple[str, ...] = ("cpu", "ram", "disk", "ports")
NUM_RESOURCES = len(RESOURCE_NAMES)
CPU, RAM, DISK, PORTS = range(NUM_RESOURCES)
UNITS: tuple[str, ...] = ("milli-cores", "bytes", "bytes", "ports")

# Comparisons of resource sums tolerate this much rounding (in each dimension's unit).
EPSILON = 1e-6
_INF = float("inf")


@dataclass(frozen=True)
class Resources:
    """A vector of resource quantities: CPU milli-cores, RAM bytes, disk bytes, ports."""

    cpu: float = 0.0
    ram: float = 0.0
    disk: float = 0.0
    ports: float = 0.0

    def __post_init__(self) -> None:
        # One chained comparison per field (NaN fails it too): built for every task report and
        # log record, so it stays off numpy.
        if (
            0.0 <= self.cpu < _INF
            and 0.0 <= self.ram < _INF
            and 0.0 <= self.disk < _INF
            and 0.0 <= self.ports < _INF
        ):
            return
        for name in RESOURCE_NAMES:
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"resource {name} must be finite and >= 0, got {value!r}")

    def array(self) -> FloatArray:
        return np.array([self.cpu, self.ram, self.disk, self.ports], dtype=np.float64)

    @classmethod
    def from_array(cls, values: npt.ArrayLike) -> Resources:
        v = np.asarray(values, dtype=np.float64).reshape(NUM_RESOURCES)
        return cls(float(v[0]), float(v[1]), float(v[2]), float(v[3]))

    @classmethod
    def of(
        cls, cores: float = 0.0, ram_gib: float = 0.0, disk_gib: float = 0.0, ports: float = 0.0
    ) -> Resources:
        """Builds a request in human units: cores, GiB of RAM, GiB of disk, ports."""
        return cls(cores * 1000.0, ram_gib * GIB, disk_gib * GIB, ports)

    def scaled(self, factor: float) -> Resources:
        return Resources.from_array(self.array() * factor)


def format_amount(resource: int, amount: float) -> str:
    """A human-readable quantity of one resource dimension (used in reasons)."""
    if resource == CPU:
        return f"{amount / 1000.0:.3g} cores"
    if resource in (RAM, DISK):
        return f"{amount / GIB:.3g} GiB"
    return f"{amount:.0f} ports"
