"""Runs every benchmark module (``bench/bench_*.py``) whose figures match ``--prefix``.

Usage: ``python -m bench.run [--prefix PREFIX] [--size full|smoke] [--out bench-results.json]``.
``--size smoke`` runs each at the size the test suite runs it (seconds; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

import bench
from bench.harness import FULL, SIZE_NAMES, Recorder


def benchmark_modules() -> list[str]:
    """The names of every benchmark module (``bench/bench_*.py``), sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))


def load(name: str) -> ModuleType:
    return importlib.import_module(f"bench.{name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefix", default="", help="only figures whose names start with this")
    parser.add_argument("--size", default=FULL, choices=SIZE_NAMES, help="the benchmarks' size")
    parser.add_argument("--out", default="bench-results.json")
    args = parser.parse_args(argv)

    recorder = Recorder(args.prefix)
    failures: list[str] = []
    durations: dict[str, float] = {}
    for name in benchmark_modules():
        module = load(name)
        figures: list[str] = list(getattr(module, "FIGURES", []))
        if not recorder.wants(figures):
            continue
        print(f"== {name} ({', '.join(figures)})", flush=True)
        started = time.monotonic()
        try:
            module.run(recorder, size=args.size)
        except Exception:  # a broken benchmark must not hide the others' figures
            traceback.print_exc()
            failures.append(name)
        durations[name] = time.monotonic() - started
        print(f"== {name}: {durations[name]:.0f} s", flush=True)
    Path(args.out).write_text(json.dumps(recorder.figures, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(recorder.figures)} figures to {args.out}")
    print("wall time per module: " + ", ".join(f"{n} {s:.0f} s" for n, s in durations.items()))
    if failures:
        print(f"benchmarks that failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
