"""Tasks' instantaneous CPU usage for the GPA Monte Carlo study (GPA §3, §5.1).

**Synthetic tasks.** GPA §3.5 clusters the empirical distributions of long tasks'
instantaneous CPU usage into 16 shapes and finds that no single distribution fits:
46.5 % of tasks (clusters c, f, k) almost always use ~0 CPU, 8.6 % (b, p) look
exponential, 12.7 % (h, j, m) are mixtures, and the remaining 32.2 % are other,
mostly unimodal, shapes. We draw each task's shape family with those shares (the
unimodal rest split evenly into gamma, log-normal and uniform). The scale comes from
the paper's statistics, not from the study's outcome: the mean task uses 0.0274 of a
machine (Table 1: 13.69 for 500 tasks; c = 1 is the largest machine, §3.1), and a
task's standard deviation follows the instantaneous trend line of §3.3,
sigma = 0.015 + 0.36 mu (with log-normal scatter). Task means are log-normal. A
near-zero task is idle except for bursts in a share p = mu^2 / (sigma^2 + mu^2) of its
samples, so "almost always 0" (p of a few %) needs sigma >= 3 mu, i.e. mu <~ 0.006
on the trend line: near-zero means have a median of 0.003, and the other families'
mean is set so that the population mean stays 0.0274. Usage is clipped to [0, 1].

**Trace format.** GPA §3.1 stores, per task, R realisations of its instantaneous
usage drawn from its empirical distribution. We read the same data as text, one task
per line::

    # comments and blank lines are ignored
    <task id> [inst|avg] <x_1> <x_2> ... <x_R>

Values are separated by spaces or commas and normalised to the capacity of the
largest machine (§3.1). The optional kind says whether the values are instantaneous
(``inst``, the default) or 5-minute average (``avg``) samples; the study uses
``inst``. Every line of a kind must have the same R. Reading and writing work on
lines of text (no file I/O here).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

MEAN_TASK_USAGE = 13.69 / 500  # GPA Table 1
MEAN_LOG_SIGMA = 1.0  # spread of task means (log-normal); the paper shows a wide range (Figure 3)
NEAR_ZERO_MEDIAN = 0.003  # near-zero tasks: bursts in a few % of samples (see above)
STD_INTERCEPT, STD_SLOPE = 0.015, 0.36  # GPA §3.3, instantaneous trend line
STD_LOG_SIGMA = 0.3

# (family, share): GPA §3.5 cluster shares grouped by the shapes the paper names.
SHAPE_FAMILIES: tuple[tuple[str, float], ...] = (
    ("near-zero", 0.1762 + 0.1370 + 0.1522),  # (c), (f), (k)
    ("exponential", 0.0547 + 0.0309),  # (b), (p)
    ("mixture", 0.0227 + 0.0348 + 0.0696),  # (h), (j), (m)
    ("gamma", 0.3219 / 3),
    ("lognormal", 0.3219 / 3),
    ("uniform", 0.3219 / 3),
)


def _family_samples(
    family: str, mu: np.ndarray, sigma: np.ndarray, realizations: int, rng: np.random.Generator
) -> np.ndarray:
    """Samples (n, R) of one family with (approximately) the given means and stds."""
    n = mu.size
    size = (n, realizations)
    m = mu[:, None]
    s = sigma[:, None]
    if family == "near-zero":
        # Mostly idle with rare bursts of height L and probability p: p L = mu, p L^2 = s^2 + mu^2.
        height = np.minimum((s**2 + m**2) / m, 1.0)
        p = np.minimum(m / height, 1.0)
        burst = rng.random(size) < p
        idle = rng.random(size) * (0.05 * m)
        return np.where(burst, height * rng.uniform(0.8, 1.2, size), idle)
    if family == "exponential":
        return rng.exponential(1.0, size) * m
    if family == "mixture":
        p = rng.uniform(0.2, 0.5, (n, 1))
        low = np.maximum(m - s * np.sqrt(p / (1 - p)), 0.0)
        high = m + s * np.sqrt((1 - p) / p)
        pick = rng.random(size) < p
        centre = np.where(pick, high, low)
        return centre * rng.gamma(25.0, 1.0 / 25.0, size)  # each mode smeared by ~20 %
    if family == "gamma":
        shape = (m / s) ** 2
        return rng.gamma(np.broadcast_to(shape, size), 1.0) * (s**2 / m)
    if family == "lognormal":
        s2 = np.log1p((s / m) ** 2)
        return np.exp(rng.normal(np.log(m) - s2 / 2, np.sqrt(s2), size))
    if family == "uniform":
        half = np.sqrt(3.0) * s
        return m + rng.uniform(-1.0, 1.0, size) * half
    raise ValueError(f"unknown shape family {family!r}")


def synthetic_usage(tasks: int, realizations: int, rng: np.random.Generator) -> tuple[F32, list[str]]:
    """Instantaneous usage samples (tasks, realizations) and each task's shape family."""
    names = [name for name, _ in SHAPE_FAMILIES]
    shares = np.array([share for _, share in SHAPE_FAMILIES])
    shares = shares / shares.sum()
    family = rng.choice(len(names), size=tasks, p=shares)
    near_zero = family == names.index("near-zero")
    # Log-normal means: near-zero tasks around NEAR_ZERO_MEDIAN, the rest scaled so that the
    # population mean is MEAN_TASK_USAGE.
    spread = np.exp(MEAN_LOG_SIGMA**2 / 2)  # mean / median of a log-normal
    near_zero_mean = NEAR_ZERO_MEDIAN * spread
    share_nz = shares[names.index("near-zero")]
    other_mean = (MEAN_TASK_USAGE - share_nz * near_zero_mean) / (1.0 - share_nz)
    median = np.where(near_zero, NEAR_ZERO_MEDIAN, other_mean / spread)
    mu = np.clip(median * rng.lognormal(0.0, MEAN_LOG_SIGMA, tasks), 0.0005, 0.4)
    sigma = (STD_INTERCEPT + STD_SLOPE * mu) * rng.lognormal(0.0, STD_LOG_SIGMA, tasks)
    out = np.empty((tasks, realizations), dtype=np.float32)
    for k, name in enumerate(names):
        rows = np.flatnonzero(family == k)
        if rows.size:
            samples = _family_samples(name, mu[rows], sigma[rows], realizations, rng)
            out[rows] = np.clip(samples, 0.0, 1.0)
    return out, [names[k] for k in family.tolist()]


@dataclass(frozen=True)
class GpaTrace:
    task_ids: tuple[str, ...]
    inst: F32  # (tasks, R) instantaneous usage realisations
    avg: F32 | None = None  # (tasks, R) 5-minute average realisations, when present


def read_gpa_trace(lines: Iterable[str]) -> GpaTrace:
    """Parses the text format described in the module docstring."""
    rows: dict[str, dict[str, list[float]]] = {"inst": {}, "avg": {}}
    order: list[str] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.replace(",", " ").split()
        task_id, rest = tokens[0], tokens[1:]
        kind = "inst"
        if rest and rest[0] in ("inst", "avg"):
            kind, rest = rest[0], rest[1:]
        if not rest:
            raise ValueError(f"line {number}: task {task_id} has no samples")
        try:
            values = [float(v) for v in rest]
        except ValueError as err:
            raise ValueError(f"line {number}: {err}") from None
        if task_id in rows[kind]:
            raise ValueError(f"line {number}: task {task_id} appears twice ({kind})")
        rows[kind][task_id] = values
        if task_id not in order:
            order.append(task_id)

    def matrix(kind: str) -> F32 | None:
        table = rows[kind]
        if not table:
            return None
        missing = [t for t in order if t not in table]
        if missing:
            raise ValueError(f"tasks without {kind} samples: {missing[:5]}")
        lengths = {len(v) for v in table.values()}
        if len(lengths) != 1:
            raise ValueError(f"every task needs the same number of {kind} samples, got {sorted(lengths)}")
        out = np.array([table[t] for t in order], dtype=np.float32)
        if np.any(out < 0) or not np.all(np.isfinite(out)):
            raise ValueError(f"{kind} samples must be finite and >= 0")
        return out

    inst = matrix("inst")
    if inst is None:
        raise ValueError("the trace has no instantaneous (inst) samples")
    return GpaTrace(tuple(order), inst, matrix("avg"))


def write_gpa_trace(trace: GpaTrace, precision: int = 5) -> Iterator[str]:
    """Lines of the text format (the inverse of :func:`read_gpa_trace`)."""
    yield "# GPA trace: <task id> <kind> <realisations...>; usage normalised to the largest machine"
    for kind, data in (("inst", trace.inst), ("avg", trace.avg)):
        if data is None:
            continue
        for task_id, row in zip(trace.task_ids, data, strict=True):
            yield f"{task_id} {kind} " + " ".join(f"{v:.{precision}g}" for v in row.tolist())
