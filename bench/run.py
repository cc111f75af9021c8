"""Runs every benchmark module (``bench/bench_*.py``) whose figures match ``--prefix``.

Usage: ``python -m bench.run [--prefix PREFIX] [--out bench-results.json]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import traceback
from pathlib import Path

import bench
from bench.harness import Recorder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefix", default="", help="only figures whose names start with this")
    parser.add_argument("--out", default="bench-results.json")
    args = parser.parse_args(argv)

    recorder = Recorder(args.prefix)
    failures: list[str] = []
    modules = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    for name in modules:
        module = importlib.import_module(f"bench.{name}")
        figures: list[str] = list(getattr(module, "FIGURES", []))
        if not recorder.wants(figures):
            continue
        print(f"== {name} ({', '.join(figures)})", flush=True)
        try:
            module.run(recorder)
        except Exception:  # a broken benchmark must not hide the others' figures
            traceback.print_exc()
            failures.append(name)
    Path(args.out).write_text(json.dumps(recorder.figures, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(recorder.figures)} figures to {args.out}")
    if failures:
        print(f"benchmarks that failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
