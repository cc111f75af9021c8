"""Synthetic VM traces for the lifetime-aware placement study (LAVA §2.1, §5.1).

The table itself (:class:`~cellpilot.lifetimes.vm_table.VmTrace`) and what every consumer
shares about it live in :mod:`cellpilot.lifetimes.vm_table`; this module draws one.

:func:`generate_vm_trace` draws a seeded synthetic trace with the properties LAVA
§2.1 and §3 describe:

* most VMs are short-lived, yet most core-hours belong to long-lived VMs (§2.1
  reports 88 % of VMs under 1 h and 98 % of core-hours in VMs of 1 h or more);
* lifetimes depend on the features only partly (§2.1 Figure 2, §3 item 1): each
  VM draws a lifetime *component* from a mixture whose weights depend on its
  features, so one feature vector maps to a bimodal or heavy-tailed distribution;
* arrivals follow a daily cycle, and the category mix changes with the hour.

The demand is calibrated so that the expected number of allocated cores is
``target_core_utilisation`` of a pool of ``hosts`` hosts, and the VMs alive at the
start are drawn from the stationary (length-biased) population, so a replay starts
in steady state instead of from an empty pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.lifetimes.vm_table import DAY, HOUR, MINUTE, FloatArray, IntArray, VmTrace


@dataclass(frozen=True)
class LifetimeComponent:
    """One mode of the lifetime mixture: log-normal, or Pareto when ``pareto_alpha`` > 0."""

    name: str
    median_hours: float
    sigma: float = 0.0
    pareto_alpha: float = 0.0  # > 0: Pareto with minimum ``median_hours`` and this tail index

    def sample(self, rng: np.random.Generator, n: int, cap: float) -> FloatArray:
        if self.pareto_alpha > 0:
            hours = self.median_hours * (1.0 + rng.pareto(self.pareto_alpha, n))
        else:
            hours = self.median_hours * np.exp(self.sigma * rng.standard_normal(n))
        return np.minimum(hours * HOUR, cap)


COMPONENTS: tuple[LifetimeComponent, ...] = (
    LifetimeComponent("ephemeral", 0.1, 0.9),
    LifetimeComponent("short", 0.6, 0.6),
    LifetimeComponent("hours", 4.0, 0.8),
    LifetimeComponent("day", 30.0, 0.4),
    LifetimeComponent("week", 192.0, 0.3),
    # Tail index 1.7: a VM that has run for u >= 7 days has about u / 0.7 days left (Figure 2
    # quotes 10 days after 7).
    LifetimeComponent("long", 168.0, pareto_alpha=1.7),
)
# Mixture weights of the components over all VMs before feature effects (logits of
# 0.5, 0.38, 0.07, 0.036, 0.0084, 0.006): 88 % of VMs in the two sub-hour modes (§2.1).
BASE_LOGITS = np.log(np.array([1.2, 0.9, 0.07, 0.05, 0.0003, 0.0004]))
_LONG = np.array([0.0, 0.0, 0.3, 0.6, 1.0, 1.0])  # how much a feature effect tilts each mode

CORE_SIZES = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
MEMORY_PER_CORE = np.array([1.0, 4.0, 8.0])
SSD_DISKS = np.array([0.0, 1.0, 2.0, 4.0])  # local SSD partitions of 375 GiB
SSD_PARTITION_GIB = 375.0


@dataclass(frozen=True)
class Category:
    """A workload category: its share of arrivals, its lifetime mixture and its shapes."""

    name: str
    share: float
    day_bias: float  # > 0: more arrivals during working hours
    logits: tuple[float, ...]  # added to BASE_LOGITS, over COMPONENTS
    cores: tuple[float, ...]  # probabilities over CORE_SIZES
    memory: tuple[float, ...]  # over MEMORY_PER_CORE
    ssd: tuple[float, ...]  # over SSD_DISKS
    spot: float  # probability of the "spot" tier
    committed: float  # probability of the "committed" tier (long-running commitments)


CATEGORIES: tuple[Category, ...] = (
    Category("batch", 0.28, 0.0, (0.3, 0.3, 0.5, -0.5, -2.0, -3.0), (0.3, 0.3, 0.2, 0.15, 0.05, 0.0),
             (0.6, 0.3, 0.1), (0.9, 0.1, 0.0, 0.0), 0.35, 0.0),
    Category("ci", 0.30, 1.0, (0.8, 0.0, -1.0, -2.0, -3.0, -4.0), (0.2, 0.4, 0.3, 0.1, 0.0, 0.0),
             (0.5, 0.5, 0.0), (0.95, 0.05, 0.0, 0.0), 0.3, 0.0),
    Category("dev", 0.12, 1.0, (0.0, 0.0, 0.0, 1.2, -0.5, -1.0), (0.3, 0.4, 0.2, 0.1, 0.0, 0.0),
             (0.3, 0.6, 0.1), (0.85, 0.15, 0.0, 0.0), 0.05, 0.01),
    Category("web", 0.13, 0.3, (0.0, 0.0, -0.5, 0.0, 0.8, 1.2), (0.1, 0.3, 0.35, 0.2, 0.05, 0.0),
             (0.4, 0.5, 0.1), (0.85, 0.15, 0.0, 0.0), 0.1, 0.04),
    Category("database", 0.05, 0.0, (-0.5, -0.5, -0.5, 0.0, 1.5, 2.0), (0.0, 0.1, 0.3, 0.3, 0.2, 0.1),
             (0.25, 0.55, 0.2), (0.5, 0.3, 0.15, 0.05), 0.0, 0.12),
    Category("analytics", 0.12, 0.2, (0.0, 0.3, 1.0, 0.8, -0.5, -1.0), (0.05, 0.15, 0.3, 0.3, 0.15, 0.05),
             (0.3, 0.4, 0.3), (0.7, 0.2, 0.1, 0.0), 0.25, 0.01),
)  # fmt: skip
TIER_NAMES = ("standard", "spot", "committed")
# Logits each tier adds to the mixture: spot VMs rarely live long; committed ones mostly do.
TIER_OFFSETS = np.array(
    [
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, -1.0, -3.0, -3.0],
        [-2.5, -2.5, -1.0, 0.5, 6.5, 6.5],
    ]
)


@dataclass(frozen=True)
class Population:
    """The lifetime mixture, categories and tiers a synthetic trace is drawn from."""

    components: tuple[LifetimeComponent, ...]
    base_logits: FloatArray
    long_tilt: FloatArray  # how much a feature effect tilts each mode toward long lifetimes
    categories: tuple[Category, ...]
    tier_offsets: FloatArray  # (3 tiers, components) logits


DEFAULT_POPULATION = Population(COMPONENTS, BASE_LOGITS, _LONG, CATEGORIES, TIER_OFFSETS)
# A second population for held-out evaluation (models and policies are not tuned on it):
# every mode, category and tier effect is moved, more owners with stronger habits, a
# stronger daily cycle (see VmTraceConfig.population).
SHIFTED_POPULATION = Population(
    components=(
        LifetimeComponent("ephemeral", 0.25, 1.1),
        LifetimeComponent("short", 1.5, 0.7),
        LifetimeComponent("hours", 6.0, 1.0),
        LifetimeComponent("day", 50.0, 0.6),
        LifetimeComponent("week", 300.0, 0.5),
        LifetimeComponent("long", 400.0, pareto_alpha=1.4),
    ),
    base_logits=np.log(np.array([1.0, 0.8, 0.15, 0.06, 0.0008, 0.0006])),
    long_tilt=np.array([0.0, 0.2, 0.5, 0.8, 1.0, 1.0]),
    categories=(
        Category("batch", 0.20, 0.2, (0.5, 0.2, 0.8, -0.2, -2.5, -3.0), (0.2, 0.3, 0.3, 0.15, 0.05, 0.0),
                 (0.5, 0.4, 0.1), (0.8, 0.2, 0.0, 0.0), 0.5, 0.0),
        Category("ci", 0.20, 1.2, (1.0, 0.3, -0.5, -1.5, -3.5, -4.0), (0.3, 0.4, 0.2, 0.1, 0.0, 0.0),
                 (0.6, 0.4, 0.0), (0.9, 0.1, 0.0, 0.0), 0.2, 0.0),
        Category("dev", 0.20, 1.5, (-0.3, 0.2, 0.5, 1.5, -0.2, -1.5), (0.4, 0.4, 0.15, 0.05, 0.0, 0.0),
                 (0.2, 0.7, 0.1), (0.9, 0.1, 0.0, 0.0), 0.1, 0.02),
        Category("web", 0.20, 0.5, (-0.5, 0.0, 0.0, 0.5, 1.2, 0.8), (0.05, 0.2, 0.4, 0.25, 0.1, 0.0),
                 (0.3, 0.6, 0.1), (0.8, 0.2, 0.0, 0.0), 0.05, 0.08),
        Category("database", 0.08, 0.0, (-1.0, -0.5, 0.0, 0.5, 1.8, 1.5), (0.0, 0.05, 0.25, 0.35, 0.25, 0.1),
                 (0.2, 0.5, 0.3), (0.4, 0.3, 0.2, 0.1), 0.0, 0.2),
        Category("analytics", 0.12, 0.5, (0.2, 0.5, 1.2, 0.5, -1.0, -1.5), (0.05, 0.1, 0.3, 0.35, 0.15, 0.05),
                 (0.2, 0.5, 0.3), (0.6, 0.3, 0.1, 0.0), 0.4, 0.0),
    ),
    tier_offsets=np.array(
        [
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [0.8, 0.3, -0.5, -1.5, -2.5, -3.5],
            [-2.0, -2.0, -0.5, 1.0, 4.5, 4.5],
        ]
    ),
)  # fmt: skip
POPULATIONS = {"default": DEFAULT_POPULATION, "shifted": SHIFTED_POPULATION}


@dataclass(frozen=True)
class VmTraceConfig:
    """Size and calibration of a synthetic trace."""

    days: float = 14.0
    hosts: int = 100  # the demand is sized for a pool of this many hosts ...
    host_cores: float = 64.0
    host_memory_gib: float = 256.0
    host_ssd_gib: float = 8 * SSD_PARTITION_GIB
    target_core_utilisation: float = 0.75  # ... so that this share of cores is allocated on average
    daily_amplitude: float = 0.4  # arrival rate swings this much around its mean over a day
    owners: int = 64
    zones: int = 3
    owner_effect: float = 1.0  # std-dev of an owner's tilt toward long-lived modes (logits)
    # The owners' habits are part of the "world", shared by traces drawn with different
    # generators (a history to train on and a trace to replay), so they come from this seed.
    world_seed: int = 0
    max_lifetime_days: float = 365.0
    calibration_samples: int = 60_000
    population: str = "default"  # a key of POPULATIONS

    @property
    def mix(self) -> Population:
        return POPULATIONS[self.population]

    def __post_init__(self) -> None:
        if self.days <= 0 or self.hosts <= 0 or self.owners <= 0 or self.zones <= 0:
            raise ValueError("days, hosts, owners and zones must be > 0")
        if not 0 < self.target_core_utilisation < 1:
            raise ValueError("target_core_utilisation must be in (0, 1)")
        if not 0 <= self.daily_amplitude < 1:
            raise ValueError("daily_amplitude must be in [0, 1)")
        if self.population not in POPULATIONS:
            raise ValueError(f"unknown population {self.population!r}; known: {', '.join(POPULATIONS)}")


def _working_hours(t: FloatArray) -> FloatArray:
    """0 at 03:00, 1 at 15:00: the daily cycle of interactive work."""
    return 0.5 * (1.0 + np.sin(2.0 * np.pi * (t / DAY - 0.375)))


def _pick(rng: np.random.Generator, probs: FloatArray) -> IntArray:
    """One categorical draw per row of ``probs`` (rows sum to 1)."""
    cum = np.cumsum(probs, axis=1)
    u = rng.random(probs.shape[0]) * cum[:, -1]
    return np.minimum((cum < u[:, None]).sum(axis=1), probs.shape[1] - 1).astype(np.int64)


@dataclass
class _Draw:
    category: IntArray
    owner: IntArray
    zone: IntArray
    tier: IntArray
    cores: FloatArray
    memory_gib: FloatArray
    ssd_gib: FloatArray
    lifetime: FloatArray


def _draw_vms(rng: np.random.Generator, times: FloatArray, config: VmTraceConfig, tilt: FloatArray) -> _Draw:
    n = times.shape[0]
    mix = config.mix
    cats = mix.categories
    share = np.array([c.share for c in cats])
    bias = np.array([c.day_bias for c in cats])
    work = _working_hours(times)
    weights = share[None, :] * (1.0 + bias[None, :] * (2.0 * work[:, None] - 1.0) * 0.8)
    category = _pick(rng, weights / weights.sum(axis=1, keepdims=True))
    popularity = 1.0 / np.arange(1, config.owners + 1) ** 0.8
    owner = np.asarray(rng.choice(config.owners, size=n, p=popularity / popularity.sum()), dtype=np.int64)
    zone = np.asarray(rng.integers(0, config.zones, size=n), dtype=np.int64)
    tier_probs = np.array([(1.0 - c.spot - c.committed, c.spot, c.committed) for c in cats])[category]
    tier = _pick(rng, tier_probs)
    cores = CORE_SIZES[_pick(rng, np.array([c.cores for c in cats])[category])]
    memory = cores * MEMORY_PER_CORE[_pick(rng, np.array([c.memory for c in cats])[category])]
    ssd = SSD_PARTITION_GIB * SSD_DISKS[_pick(rng, np.array([c.ssd for c in cats])[category])]
    # Mixture weights: the category's logits, tilted toward long modes by the owner's habit,
    # big shapes and local SSD, and by the tier (§2.1: features explain
    # lifetimes only partly; the mode itself stays random).
    shift = tilt[owner] + 0.5 * (cores >= 16) + 0.6 * (ssd > 0)
    logits = mix.base_logits + np.array([c.logits for c in cats])[category] + mix.tier_offsets[tier]
    logits += shift[:, None] * mix.long_tilt[None, :]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    mode = _pick(rng, probs / probs.sum(axis=1, keepdims=True))
    cap = config.max_lifetime_days * DAY
    lifetime = np.empty(n)
    for k, component in enumerate(mix.components):
        rows = np.flatnonzero(mode == k)
        lifetime[rows] = component.sample(rng, rows.size, cap)
    lifetime = np.maximum(lifetime, MINUTE)
    return _Draw(category, owner, zone, tier, cores, memory, ssd, lifetime)


def generate_vm_trace(rng: np.random.Generator, config: VmTraceConfig | None = None) -> VmTrace:
    """A synthetic trace of ``config.days`` days plus the VMs running at its start."""
    config = config or VmTraceConfig()
    tilt = config.owner_effect * np.random.default_rng(config.world_seed).standard_normal(config.owners)
    # Calibrate the arrival rate on a large sample of VMs spread over one day.
    sample_times = rng.random(config.calibration_samples) * DAY
    sample = _draw_vms(rng, sample_times, config, tilt)
    mean_core_seconds = float(np.mean(sample.cores * sample.lifetime))
    capacity = config.hosts * config.host_cores
    rate = config.target_core_utilisation * capacity / mean_core_seconds  # VMs per second

    # Arrivals: a Poisson process whose rate follows the daily cycle, in one-minute bins.
    horizon = config.days * DAY
    starts = np.arange(0.0, horizon, MINUTE)
    cycle = 1.0 + config.daily_amplitude * (2.0 * _working_hours(starts + 0.5 * MINUTE) - 1.0)
    counts = rng.poisson(rate * MINUTE * cycle)
    times = np.repeat(starts, counts) + rng.random(int(counts.sum())) * MINUTE
    fresh = _draw_vms(rng, times, config, tilt)

    # VMs alive at time 0: an M/G/inf system in steady state holds Poisson(rate E[L]) VMs whose
    # lifetimes are length-biased and whose ages are uniform over their lifetimes.
    n_alive = int(rng.poisson(rate * float(np.mean(sample.lifetime))))
    pick = rng.choice(sample.lifetime.shape[0], size=n_alive, p=sample.lifetime / sample.lifetime.sum())
    age = rng.random(n_alive) * sample.lifetime[pick]
    created = np.concatenate([-age, times])
    lifetime = np.concatenate([sample.lifetime[pick], fresh.lifetime])

    def both(name: str) -> npt.NDArray[np.generic]:
        return np.concatenate([getattr(sample, name)[pick], getattr(fresh, name)])

    order = np.argsort(created, kind="stable")
    n = created.shape[0]
    return VmTrace(
        vm_id=np.arange(n, dtype=np.int64),
        created=created[order],
        deleted=(created + lifetime)[order],
        cores=both("cores")[order].astype(np.float64),
        memory_gib=both("memory_gib")[order].astype(np.float64),
        ssd_gib=both("ssd_gib")[order].astype(np.float64),
        category=both("category")[order].astype(np.int64),
        owner=both("owner")[order].astype(np.int64),
        zone=both("zone")[order].astype(np.int64),
        tier=both("tier")[order].astype(np.int64),
        horizon=horizon,
        censored=np.zeros(n, dtype=bool),
        category_names=tuple(c.name for c in config.mix.categories),
        tier_names=TIER_NAMES,
        source="synthetic",
    )
