"""Every benchmark still runs: each ``bench/bench_*.py`` module, found by name, at its smoke size.

A smoke run takes seconds and its figures mean nothing; what it shows is that the benchmark
runs end to end against today's code (a refactor that breaks a benchmark breaks the suite) and
still produces every figure it declares in ``FIGURES``, each a finite number. A module without a
smoke size (``SIZES["smoke"]``) fails here, and so does one that leaves a process running.
The benchmarks that need stores start their own embedded stack on free ports in a temporary
directory, never ``cellpilot run``'s fixed ports.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from bench.harness import SMOKE, Recorder
from bench.run import benchmark_modules, load

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _children() -> dict[int, psutil.Process]:
    """This process's live descendants, less Python's own multiprocessing resource tracker
    (started once per interpreter by the first multiprocessing queue; it lives until exit)."""
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any("resource_tracker" in part for part in child.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out[child.pid] = child
    return out


def _left_running(before: dict[int, psutil.Process], within_s: float = 10.0) -> list[str]:
    """Processes started since ``before`` still alive ``within_s`` after the benchmark returned
    (then killed, so that a failing benchmark leaves nothing behind either)."""
    deadline = time.monotonic() + within_s
    while (new := [p for pid, p in _children().items() if pid not in before]) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = []
    for process in new:
        try:
            described.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
            process.kill()
        except psutil.NoSuchProcess:
            continue
    return described


def smoke_run(module: ModuleType) -> dict[str, float]:
    """Runs ``module`` at its smoke size; its figures, after checking each declared one is there,
    finite, and nothing else was reported. Raises AssertionError saying what is wrong."""
    name = module.__name__
    figures = list(getattr(module, "FIGURES", []))
    assert figures, f"{name} declares no FIGURES"
    sizes = getattr(module, "SIZES", {})
    assert SMOKE in sizes, (
        f"{name} has no smoke size: give it SIZES = {{'full': ..., 'smoke': ...}} and "
        "run(report, size='full'), the smoke size taking seconds (bench/harness.py)"
    )
    recorder = Recorder()
    before = _children()
    try:
        module.run(recorder, size=SMOKE)
    finally:
        left = _left_running(before)
    assert not left, f"{name} left processes running: {left}"
    missing = [f for f in figures if f not in recorder.figures]
    undeclared = [f for f in recorder.figures if f not in figures]
    not_finite = {f: v for f, v in recorder.figures.items() if not math.isfinite(v)}
    assert not missing, f"{name} did not report {missing}"
    assert not undeclared, f"{name} reported figures it does not declare in FIGURES: {undeclared}"
    assert not not_finite, f"{name} reported figures that are not finite numbers: {not_finite}"
    return recorder.figures


def test_every_benchmark_file_is_a_discovered_module() -> None:
    on_disk = sorted(p.stem for p in (ROOT / "bench").glob("bench_*.py"))
    assert on_disk, "no benchmark found"
    assert benchmark_modules() == on_disk


def test_a_benchmark_without_a_smoke_size_fails_the_smoke_run() -> None:
    module = ModuleType("bench.bench_unsized")
    module.FIGURES = ["x.y"]  # type: ignore[attr-defined]
    module.run = lambda report, size="full": report("x.y", 1.0, "s")  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="no smoke size"):
        smoke_run(module)


def test_a_benchmark_missing_a_declared_figure_fails_the_smoke_run() -> None:
    module = ModuleType("bench.bench_partial")
    module.FIGURES = ["x.y", "x.z"]  # type: ignore[attr-defined]
    module.SIZES = {"full": None, SMOKE: None}  # type: ignore[attr-defined]
    module.run = lambda report, size="full": report("x.y", float("nan"), "s")  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match=r"did not report \['x.z'\]"):
        smoke_run(module)


@pytest.mark.parametrize("name", benchmark_modules())
def test_benchmark_runs_at_smoke_size(name: str) -> None:
    module = load(name)
    if getattr(module, "NEEDS_COMPOSE_IMAGES", False):
        # Its scenarios and figures run in tests/containers, on the images `make images` builds.
        pytest.skip(f"{name} needs the compose images: the container tests run its smoke size")
    smoke_run(module)
