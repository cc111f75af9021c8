"""A workload for ``process`` tasks: allocates and touches memory and burns CPU to a profile.

``python -m cellpilot_services.borglet.workload_program --profile PROFILE`` where PROFILE is

* a list of steps ``DURATION:MEMORY:CPU`` separated by commas, e.g.
  ``2s:50MiB:200m,30s:300MiB:0`` — hold 50 MiB and burn 200 millicores for 2 s, then grow to
  300 MiB and idle for 30 s. Memory is in B, KiB, MiB, GiB (or KB, MB, GB); CPU in
  millicores (``500m``) or cores (``0.5``); durations in ``s`` or ``ms``. After the last step
  the program exits with ``--exit-code`` (default 0), or with ``--then hold`` keeps the last
  step's usage until killed;
* ``model:NAME`` to follow a usage model of :mod:`cellpilot.world.usage_models` in real
  time (``--param name=value``, repeatable; ``--seed``; ``--duration`` seconds, 0 = forever).

Memory grows at most ``--grow-rate`` per second (default 256MiB), in 4 MiB chunks whose every
page is written so they are resident: a Borglet metering once a second sees the growth and
can OOM-kill the task before it takes the whole machine. CPU is burnt in a duty cycle of
100 ms slices on one core (at most 1000 millicores).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CHUNK_BYTES = 4 << 20
PAGE_BYTES = 4096
SLICE_S = 0.1

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
}


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a memory size: {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_millicores(text: str) -> float:
    text = text.strip()
    if text.endswith("m"):
        return float(text[:-1])
    return float(text) * 1000.0


def parse_seconds(text: str) -> float:
    text = text.strip()
    if text.endswith("ms"):
        return float(text[:-2]) / 1000.0
    return float(text.removesuffix("s"))


@dataclass(frozen=True)
class Step:
    seconds: float
    memory_bytes: int
    cpu_millicores: float


def parse_steps(profile: str) -> list[Step]:
    steps = []
    for part in profile.split(","):
        fields = part.split(":")
        if len(fields) != 3:
            raise ValueError(f"a step is DURATION:MEMORY:CPU, got {part!r}")
        steps.append(Step(parse_seconds(fields[0]), parse_bytes(fields[1]), parse_millicores(fields[2])))
    if not steps:
        raise ValueError("the profile has no step")
    return steps


def steps_target(steps: Sequence[Step], elapsed: float) -> Step | None:
    """The step in force ``elapsed`` seconds after the start (None once all are over)."""
    end = 0.0
    for step in steps:
        end += step.seconds
        if elapsed < end:
            return step
    return None


class Memory:
    """Resident memory held in chunks, every page written."""

    def __init__(self) -> None:
        self.chunks: list[bytearray] = []

    @property
    def size(self) -> int:
        return len(self.chunks) * CHUNK_BYTES

    def move_towards(self, target: int, max_growth: int) -> None:
        while self.size + CHUNK_BYTES <= target and max_growth >= CHUNK_BYTES:
            chunk = bytearray(CHUNK_BYTES)
            chunk[::PAGE_BYTES] = b"\x01" * (CHUNK_BYTES // PAGE_BYTES)
            self.chunks.append(chunk)
            max_growth -= CHUNK_BYTES
        while self.chunks and self.size > target:
            self.chunks.pop()


def burn(millicores: float, slice_s: float = SLICE_S) -> None:
    """Busy-loop for the CPU share of one slice, sleep for the rest."""
    busy = min(max(millicores, 0.0), 1000.0) / 1000.0 * slice_s
    start = time.perf_counter()
    while time.perf_counter() - start < busy:
        pass
    rest = slice_s - (time.perf_counter() - start)
    if rest > 0:
        time.sleep(rest)


def _model_target(name: str, params: dict[str, float], seed: int) -> Callable[[float], Step]:
    from cellpilot.world.usage_models import evaluate_usage, resolve_params

    resolve_params(name, params)

    def target(elapsed: float) -> Step:
        cpu, memory = evaluate_usage(name, params, seed, 0, elapsed, 0.0)
        return Step(SLICE_S, int(memory), float(cpu))

    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--then", choices=("exit", "hold"), default="exit")
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--grow-rate", default="256MiB", help="most memory added per second")
    parser.add_argument("--param", action="append", default=[], help="model parameter name=value")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=0.0, help="model mode: seconds, 0 = forever")
    args = parser.parse_args(argv)

    grow_per_slice = int(parse_bytes(args.grow_rate) * SLICE_S)
    memory = Memory()
    start = time.monotonic()
    if args.profile.startswith("model:"):
        params = dict(item.split("=", 1) for item in args.param)
        target_of = _model_target(args.profile[6:], {k: float(v) for k, v in params.items()}, args.seed)
        while args.duration <= 0 or time.monotonic() - start < args.duration:
            step = target_of(time.monotonic() - start)
            memory.move_towards(step.memory_bytes, grow_per_slice)
            burn(step.cpu_millicores)
        return 0
    steps = parse_steps(args.profile)
    last = steps[-1]
    while True:
        current = steps_target(steps, time.monotonic() - start)
        if current is None:
            if args.then == "exit":
                return int(args.exit_code)
            current = last
        memory.move_towards(current.memory_bytes, grow_per_slice)
        burn(current.cpu_millicores)


if __name__ == "__main__":
    sys.exit(main())
