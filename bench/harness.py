"""The benchmark convention shared by every ``bench/bench_*.py`` module.

A benchmark module declares the figure names it produces in ``FIGURES``, its sizes in
``SIZES`` (``{"full": ..., "smoke": ...}``: the parameters of a real measurement, and a
run of a few seconds that only shows the benchmark still works) and a
``run(report, size="full")`` function. ``report(name, value, unit)`` prints one line
``BENCH <name> <value> <unit>`` and records the figure; ``python -m bench.run``
writes every recorded figure to ``bench-results.json`` as ``{name: value}``.
``tests/bench`` runs every module at its smoke size in ``make test``, so a change that
breaks a benchmark breaks the suite.

Figures compare against a baseline measured in the same run (ratios), because the
machines are shared and absolute times are noisy.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

from cellpilot.stack import Stack, StackConfig
from cellpilot.stack.config import BrokerEngine

SIZE_NAMES = ("full", "smoke")
FULL, SMOKE = SIZE_NAMES

SizeT = TypeVar("SizeT")


def sized(sizes: Mapping[str, SizeT], size: str) -> SizeT:
    """The parameters of ``size`` from a module's ``SIZES``; a clear error for a size it lacks."""
    if size not in sizes:
        raise ValueError(f"no benchmark size {size!r} (this benchmark has {', '.join(sorted(sizes))})")
    return sizes[size]


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


@contextmanager
def embedded_stack(prefix: str, broker: BrokerEngine = "memory") -> Iterator[tuple[Stack, Path]]:
    """A fresh embedded stack (free ports, a temporary data directory) and a directory beside it
    for the benchmark's own logs. Its broker is the in-memory one, which the benchmarks reach
    anonymously, unless ``broker`` says "durable" (then every client needs the stack's logins,
    ``StackEndpoints.broker_login``); the stack is stopped and the directory removed on the way out,
    also when starting the stack or the benchmark failed — then the logs (the benchmark's
    processes' and the stack's) are kept, and the line before the error says where."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        base = Path(tmp)
        stack = Stack(StackConfig(base / "stack", broker=broker))
        try:
            stack.up()
            yield stack, base
        except BaseException:
            kept = Path(tempfile.mkdtemp(prefix=f"{prefix}logs-"))
            for log in base.rglob("*.log"):
                shutil.copy2(log, kept / str(log.relative_to(base)).replace("/", "_"))
            print(f"  the logs of this run are kept in {kept}", flush=True)
            raise
        finally:
            stack.down()
