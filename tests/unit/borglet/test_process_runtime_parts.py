"""The process runtime's parts: task cgroups (against a directory laid out like a delegated cgroup
v2 directory) and the bundled workload program's profile parsing and memory holding."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellpilot_services.borglet.task_cgroups import TaskCgroups
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


def _fake_cgroup(tmp_path: Path, controllers: str) -> Path:
    """A directory laid out like a delegated cgroup v2 directory (the kernel's files as plain files)."""
    (tmp_path / "cgroup.controllers").write_text(controllers)
    (tmp_path / "cgroup.subtree_control").write_text("")
    return tmp_path


def test_task_cgroups_need_the_cpu_and_memory_controllers(tmp_path: Path) -> None:
    cgroups, decision = TaskCgroups.detect(str(_fake_cgroup(tmp_path, "memory io")), "b1")
    assert cgroups is None
    assert "the cpu controller is not available" in decision.missing[0]
    cgroups, decision = TaskCgroups.detect("none", "b1")
    assert (cgroups, decision.mode) == (None, "borglet-metering")
    cgroups, decision = TaskCgroups.detect(str(tmp_path / "missing"), "b1")
    assert cgroups is None
    assert "not a cgroup v2 directory" in decision.missing[0]


def test_task_cgroups_write_limits_and_read_usage(tmp_path: Path) -> None:
    cgroups, decision = TaskCgroups.detect(str(_fake_cgroup(tmp_path, "cpu io memory")), "b1")
    assert cgroups is not None
    assert decision.usable
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert cgroups.base == tmp_path / "cellpilot-borglet-b1"
    assert (cgroups.base / "cgroup.subtree_control").read_text() == "+cpu +memory"
    path = cgroups.create("u/j/0#1", 250, 64 * MIB, hard=True)
    assert path.parent == cgroups.base
    assert (path / "cpu.max").read_text() == "25000 100000"
    assert (path / "memory.max").read_text() == str(64 * MIB)
    assert (path / "memory.oom.group").read_text() == "1"
    cgroups.set_limits(path, 1000, 64 * MIB, hard=False)  # in place: soft, one core
    assert (path / "cpu.max").read_text() == "100000 100000"
    assert (path / "memory.max").read_text() == "max"
    assert cgroups.read_usage(path) is None  # no memory.current: not a (live) cgroup
    (path / "memory.current").write_text("4096\n")
    (path / "cpu.stat").write_text("usage_usec 10\nnr_periods 9\nnr_throttled 4\nthrottled_usec 7\n")
    (path / "memory.events").write_text("oom 1\noom_kill 1\n")
    usage = cgroups.read_usage(path)
    assert usage is not None
    assert (usage.memory_current, usage.cpu.nr_throttled, usage.memory_events.oom_kill) == (4096, 4, 1)


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
