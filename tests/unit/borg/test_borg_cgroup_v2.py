"""cgroup v2 files as the Borglet writes and reads them, and the decision whether a host allows it."""

from __future__ import annotations

import errno

import pytest

from cellpilot.borg.cgroup_v2 import (
    CgroupMounts,
    CgroupProbe,
    CpuStat,
    MemoryEvents,
    cgroup_name,
    cpu_max,
    decide,
    describe_setup_error,
    enable_controllers_line,
    limit_files,
    memory_max,
    own_cgroup_dir,
    own_cgroup_path,
    parse_bytes_value,
    parse_controllers,
    parse_cpu_stat,
    parse_memory_events,
    parse_mountinfo,
    parse_usage,
)

MIB = 1 << 20

# /proc/self/mountinfo of a host with the hybrid layout: v1 controllers, and a cgroup2 mount
# that only gets what v1 left over.
HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED_MOUNTINFO = (
    "25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
)
READ_ONLY_MOUNTINFO = "612 600 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n"
V1_ONLY_MOUNTINFO = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"


# ----- limits -> files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("millicores", "line"),
    [(500, "50000 100000"), (2000, "200000 100000"), (0, "max 100000"), (5, "1000 100000")],
    ids=["half-core", "two-cores", "no-limit", "kernel-floor-1ms"],
)
def test_cpu_max_is_quota_and_period(millicores: int, line: str) -> None:
    assert cpu_max(millicores) == line


@pytest.mark.parametrize(
    ("limit", "hard", "value"),
    [(100 * MIB, True, str(100 * MIB)), (100 * MIB, False, "max"), (0, True, "max")],
    ids=["hard-limit-is-memory-max", "soft-limit-left-to-the-borglet", "no-limit"],
)
def test_memory_max_caps_only_hard_limits(limit: int, hard: bool, value: str) -> None:
    assert memory_max(limit, hard) == value


def test_limit_files_write_memory_then_cpu() -> None:
    assert limit_files(250, 64 * MIB, True) == (("memory.max", str(64 * MIB)), ("cpu.max", "25000 100000"))


@pytest.mark.parametrize(
    ("enabled", "line"),
    [
        (frozenset(), "+cpu +memory"),
        (frozenset({"memory", "io"}), "+cpu"),
        (frozenset({"cpu", "memory"}), ""),
    ],
    ids=["none-enabled", "memory-enabled", "both-enabled"],
)
def test_enable_controllers_line_adds_only_what_is_missing(enabled: frozenset[str], line: str) -> None:
    assert enable_controllers_line(enabled) == line


def test_cgroup_name_is_one_path_component() -> None:
    assert cgroup_name("team/web/3#2") == "team_web_3_2"


# ----- files -> values -----------------------------------------------------------------------------


def test_cpu_stat_gives_throttling() -> None:
    text = (
        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"
        "nr_periods 30\nnr_throttled 24\nthrottled_usec 1900000\nnr_bursts 0\nburst_usec 0\n"
    )
    assert parse_cpu_stat(text) == CpuStat(2_500_000, 30, 24, 1_900_000)
    assert parse_cpu_stat("usage_usec 7\n") == CpuStat(usage_usec=7)  # no cpu controller: no throttling


def test_memory_events_give_the_oom_kill_count() -> None:
    text = "low 0\nhigh 0\nmax 112\noom 1\noom_kill 1\noom_group_kill 1\n"
    assert parse_memory_events(text) == MemoryEvents(high=0, max=112, oom=1, oom_kill=1)
    assert parse_memory_events("") == MemoryEvents()


@pytest.mark.parametrize(
    ("text", "value"), [("104857600\n", 104857600), ("max\n", None), ("0", 0)], ids=["bytes", "max", "zero"]
)
def test_single_value_memory_files(text: str, value: int | None) -> None:
    assert parse_bytes_value(text) == value


def test_a_usage_reading_from_the_files() -> None:
    usage = parse_usage(
        {
            "memory.current": "52428800\n",
            "cpu.stat": "usage_usec 10\nnr_throttled 3\nthrottled_usec 9\n",
            "memory.events": "oom_kill 2\n",
        }
    )
    assert usage.memory_current == 50 * MIB
    assert usage.memory_peak is None  # kernels before 5.19 have no memory.peak
    assert usage.cpu.nr_throttled == 3
    assert usage.memory_events.oom_kill == 2
    assert parse_controllers("cpu io memory pids\n") == frozenset({"cpu", "io", "memory", "pids"})


# ----- where the hierarchy is -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mounts"),
    [
        (
            HYBRID_MOUNTINFO,
            CgroupMounts("/sys/fs/cgroup/unified", "/", False, frozenset({"cpu", "cpuacct", "memory"})),
        ),
        (UNIFIED_MOUNTINFO, CgroupMounts("/sys/fs/cgroup", "/", False, frozenset())),
        (READ_ONLY_MOUNTINFO, CgroupMounts("/sys/fs/cgroup", "/", True, frozenset())),
        (V1_ONLY_MOUNTINFO, CgroupMounts(None, "/", False, frozenset({"cpu", "cpuacct"}))),
    ],
    ids=["hybrid", "unified", "read-only", "v1-only"],
)
def test_mountinfo_finds_cgroup2_and_what_v1_holds(text: str, mounts: CgroupMounts) -> None:
    assert parse_mountinfo(text) == mounts


def test_own_cgroup_dir_under_the_mount() -> None:
    text = "12:memory:/user.slice\n0::/system.slice/borglet.service\n"
    assert own_cgroup_path(text) == "/system.slice/borglet.service"
    assert own_cgroup_path("4:memory:/x\n") is None  # cgroup v1 only
    unified = CgroupMounts("/sys/fs/cgroup")
    assert (
        own_cgroup_dir(unified, "/system.slice/borglet.service")
        == "/sys/fs/cgroup/system.slice/borglet.service"
    )
    assert own_cgroup_dir(unified, "/") == "/sys/fs/cgroup"
    # A mount showing only part of the hierarchy (a bind mount of the Borglet's slice).
    bound = CgroupMounts("/cg", v2_root="/system.slice")
    assert own_cgroup_dir(bound, "/system.slice/borglet.service") == "/cg/borglet.service"
    assert own_cgroup_dir(bound, "/user.slice/x") is None
    assert own_cgroup_dir(CgroupMounts(), "/x") is None


# ----- the decision ---------------------------------------------------------------------------------

UNIFIED = CgroupMounts("/sys/fs/cgroup")
BOTH = frozenset({"cpu", "memory", "io", "pids"})


def _probe(**changes: object) -> CgroupProbe:
    values: dict[str, object] = {
        "setting": "",
        "mounts": UNIFIED,
        "parent": "/sys/fs/cgroup/borglet.service",
        "controllers": BOTH,
        "euid": 0,
        "setup_error": "",
    }
    values.update(changes)
    return CgroupProbe(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("probe", "usable", "words"),
    [
        (_probe(), True, []),
        (_probe(setting="none"), False, ["turned off", "CELLPILOT_BORGLET_CGROUP_ROOT=none"]),
        (
            _probe(mounts=CgroupMounts(v1_controllers=frozenset({"cpu", "memory"})), parent=None),
            False,
            ["no cgroup2 filesystem is mounted", "cgroup v1 only: cpu, memory"],
        ),
        (_probe(parent=None), False, ["own cgroup is not visible"]),
        (
            _probe(
                mounts=CgroupMounts("/sys/fs/cgroup/unified", v1_controllers=frozenset({"cpu", "memory"})),
                controllers=frozenset({"hugetlb"}),
            ),
            False,
            ["cpu and memory controllers are not available", "offers: hugetlb", "bound to cgroup v1"],
        ),
        (
            _probe(controllers=frozenset({"memory", "pids"})),
            False,
            ["the cpu controller is not available", "not delegated to this subtree"],
        ),
        (_probe(mounts=CgroupMounts("/sys/fs/cgroup", v2_read_only=True)), False, ["mounted read-only"]),
        (_probe(setting="/tmp/not-a-cgroup", controllers=None), False, ["not a cgroup v2 directory"]),
        (_probe(setup_error="cannot write x"), False, ["cannot write x"]),
    ],
    ids=[
        "delegated",
        "turned-off",
        "no-cgroup2",
        "own-cgroup-unknown",
        "hybrid-layout",
        "cpu-not-delegated",
        "read-only",
        "explicit-root-not-cgroupfs",
        "setup-failed",
    ],
)
def test_decision_names_exactly_what_is_missing(probe: CgroupProbe, usable: bool, words: list[str]) -> None:
    decision = decide(probe)
    assert decision.usable is usable
    assert decision.mode == ("cgroup-v2" if usable else "borglet-metering")
    text = "; ".join(decision.missing)
    for word in words:
        assert word in text
    assert ("memory.max" in decision.enforced) is usable  # what is enforced instead is said too


def test_read_only_and_missing_controllers_are_both_named() -> None:
    probe = _probe(mounts=CgroupMounts("/sys/fs/cgroup", v2_read_only=True), controllers=frozenset({"cpu"}))
    missing = decide(probe).missing
    assert len(missing) == 2
    assert "read-only" in missing[0]
    assert "memory controller" in missing[1]


@pytest.mark.parametrize(
    ("code", "euid", "words"),
    [
        (
            errno.EBUSY,
            0,
            ["EBUSY", "holds processes other than the Borglet", "CELLPILOT_BORGLET_CGROUP_ROOT"],
        ),
        (errno.EACCES, 1000, ["EACCES", "uid 1000", "not delegated"]),
        (errno.EPERM, 0, ["EPERM", "even as root"]),
        (errno.EROFS, 0, ["read-only"]),
    ],
    ids=["processes-in-parent", "not-delegated-to-user", "denied-to-root", "read-only"],
)
def test_setup_errors_say_why(code: int, euid: int, words: list[str]) -> None:
    text = describe_setup_error("/sys/fs/cgroup/x/cgroup.subtree_control", code, euid)
    for word in words:
        assert word in text
