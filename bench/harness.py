"""The benchmark convention shared by every ``bench/bench_*.py`` module.

A benchmark module declares the figure names it produces in ``FIGURES`` and a
``run(report)`` function. ``report(name, value, unit)`` prints one line
``BENCH <name> <value> <unit>`` and records the figure; ``python -m bench.run``
writes every recorded figure to ``bench-results.json`` as ``{name: value}``.

Figures compare against a baseline measured in the same run (ratios), because the
machines are shared and absolute times are noisy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol


class Report(Protocol):
    def __call__(self, name: str, value: float, unit: str) -> None: ...


class Recorder:
    """Collects figures; only those whose names start with ``prefix`` are kept."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.figures: dict[str, float] = {}

    def wants(self, figure_names: list[str]) -> bool:
        return any(name.startswith(self.prefix) for name in figure_names)

    def __call__(self, name: str, value: float, unit: str) -> None:
        if not name.startswith(self.prefix):
            return
        self.figures[name] = float(value)
        print(f"BENCH {name} {value:.6g} {unit}", flush=True)


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """``with stopwatch() as elapsed: ...; elapsed()`` gives wall seconds since entry."""
    start = time.perf_counter()
    end: list[float] = []

    def elapsed() -> float:
        return (end[0] if end else time.perf_counter()) - start

    try:
        yield elapsed
    finally:
        end.append(time.perf_counter())


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    """Smallest wall time of ``repeats`` calls: the least noisy estimate on a shared machine."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
