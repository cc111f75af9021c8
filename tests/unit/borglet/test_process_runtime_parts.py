"""The process runtime's pure parts: the cgroup v2 cpu.max writer (against a fake cgroup
directory) and the bundled workload program's profile parsing and memory holding."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellpilot_services.borglet.process_runtime import CgroupCpu
from cellpilot_services.borglet.workload_program import (
    CHUNK_BYTES,
    Memory,
    Step,
    parse_bytes,
    parse_millicores,
    parse_seconds,
    parse_steps,
    steps_target,
)

MIB = 1 << 20


@pytest.mark.parametrize(
    ("millicores", "line"),
    [(500, "50000 100000"), (2000, "200000 100000"), (0, "max 100000"), (5, "1000 100000")],
    ids=["half-core", "two-cores", "no-limit", "floor-1ms"],
)
def test_cpu_max_line(millicores: int, line: str) -> None:
    assert CgroupCpu.cpu_max(millicores) == line


def _fake_root(tmp_path: Path, controllers: str) -> Path:
    (tmp_path / "cgroup.controllers").write_text(controllers)
    (tmp_path / "cgroup.subtree_control").write_text("")
    return tmp_path


def test_cgroup_detect_needs_the_cpu_controller(tmp_path: Path) -> None:
    assert CgroupCpu.detect(str(_fake_root(tmp_path, "memory io")), "b1") is None
    assert CgroupCpu.detect("none", "b1") is None
    assert CgroupCpu.detect(str(tmp_path / "missing"), "b1") is None


def test_cgroup_puts_the_task_in_its_own_group_with_its_limit(tmp_path: Path) -> None:
    cgroup = CgroupCpu.detect(str(_fake_root(tmp_path, "cpu memory")), "b1")
    assert cgroup is not None
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    path = cgroup.attach("u/j/0#1", 4242, 250)
    assert path is not None
    assert path.parent == tmp_path / "cellpilot-borglet-b1"
    assert (path / "cgroup.procs").read_text() == "4242"
    assert (path / "cpu.max").read_text() == "25000 100000"
    cgroup.set_limit(path, 1000)
    assert (path / "cpu.max").read_text() == "100000 100000"
    (path / "cpu.stat").write_text("usage_usec 10\nnr_periods 9\nnr_throttled 4\nthrottled_usec 7\n")
    assert CgroupCpu.throttled_periods(path) == 4


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512", 512),
        ("4KiB", 4096),
        ("3MiB", 3 * MIB),
        ("1.5GiB", 3 << 29),
        ("2MB", 2_000_000),
        ("7M", 7 * MIB),
    ],
    ids=["bytes", "kib", "mib", "fractional-gib", "mb", "m"],
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_parse_cpu_durations_and_steps() -> None:
    assert parse_millicores("250m") == 250
    assert parse_millicores("1.5") == 1500
    assert parse_seconds("500ms") == 0.5
    assert parse_seconds("3s") == 3
    steps = parse_steps("2s:50MiB:200m,30s:300MiB:0")
    assert steps == [Step(2, 50 * MIB, 200), Step(30, 300 * MIB, 0)]
    assert steps_target(steps, 1.9) == steps[0]
    assert steps_target(steps, 2.0) == steps[1]
    assert steps_target(steps, 32.0) is None
    with pytest.raises(ValueError, match="DURATION:MEMORY:CPU"):
        parse_steps("2s:50MiB")
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes("lots")


def test_memory_grows_at_most_the_allowed_step_and_shrinks() -> None:
    memory = Memory()
    memory.move_towards(10 * CHUNK_BYTES, max_growth=3 * CHUNK_BYTES)
    assert memory.size == 3 * CHUNK_BYTES
    memory.move_towards(10 * CHUNK_BYTES, max_growth=100 * CHUNK_BYTES)
    assert memory.size == 10 * CHUNK_BYTES
    assert all(chunk[0] == 1 for chunk in memory.chunks)  # pages written
    memory.move_towards(4 * CHUNK_BYTES, max_growth=0)
    assert memory.size == 4 * CHUNK_BYTES
