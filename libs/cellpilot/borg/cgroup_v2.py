"""How a task's limits become Linux cgroup v2 settings, and whether a host lets the Borglet use them.

Borg §6.2: early Borglets enforced limits by "post-hoc usage checking ... combined with
termination of tasks that used too much memory"; later "all Borg tasks run inside a Linux
cgroup-based resource container and the Borglet manipulates the container settings, giving
much improved control because the OS kernel is in the loop". A Borglet does the second where
the host delegates a cgroup v2 subtree to it, and falls back to the first elsewhere.

Pure: file contents in, plain data or file contents out (the Borglet's ``task_cgroups``
module does the file I/O). The rules of :mod:`cellpilot.world.enforcement` map as follows:

* **Hard RAM limit** -> ``memory.max`` = the limit. Above it the kernel reclaims and then
  OOM-kills inside the cgroup; ``memory.oom.group`` = 1 kills the whole task (not one of its
  processes) and ``memory.swap.max`` = 0 stops it swapping instead. The kill is counted in
  ``memory.events`` (``oom_kill``), which the Borglet reports as the task's OOM event
  (Borg §6.2: the Borglet "handles Out-of-Memory (OOM) events from the kernel").
* **Soft RAM limit** -> ``memory.max`` = ``max``. A task may use more than a soft limit; the
  Borglet kills it only while the machine is short of memory (Autopilot §2.3), reading
  ``memory.current``. ``memory.high`` is deliberately not used: the kernel throttles and
  reclaims a cgroup above ``memory.high`` even when the machine has memory to spare, which
  is not what a soft limit means.
* **CPU limit** -> ``cpu.max`` = quota and period (CFS bandwidth control, Borg §6.2). CPU is
  compressible: throttled, never killed; ``cpu.stat`` (``nr_throttled``, ``throttled_usec``)
  says when the kernel throttled it.
* A limit of 0 means no limit: ``max``.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TypeVar

CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's floor for cpu.max quota
# The controllers the Borglet needs in its subtree: both, or it falls back to metering.
REQUIRED_CONTROLLERS = ("cpu", "memory")
# Written once per task cgroup where the kernel offers them (older kernels lack some).
TASK_SETUP_FILES = (("memory.oom.group", "1"), ("memory.swap.max", "0"))

# Controller names a cgroup v1 hierarchy can hold (its mount's super options name them).
_V1_CONTROLLERS = frozenset(
    {
        "blkio",
        "cpu",
        "cpuacct",
        "cpuset",
        "devices",
        "freezer",
        "hugetlb",
        "memory",
        "misc",
        "net_cls",
        "net_prio",
        "perf_event",
        "pids",
        "rdma",
    }
)


# ----- limits -> file contents ------------------------------------------------------------------


def cpu_max(cpu_limit_millicores: int, period_us: int = CPU_PERIOD_US) -> str:
    """The ``cpu.max`` line for a CPU limit: quota and period in µs (``max`` = no limit)."""
    if cpu_limit_millicores <= 0:
        return f"max {period_us}"
    quota = max(MIN_CPU_QUOTA_US, cpu_limit_millicores * period_us // 1000)
    return f"{quota} {period_us}"


def memory_max(memory_limit_bytes: int, hard: bool) -> str:
    """The ``memory.max`` value: the limit if it is hard, else ``max`` (see the module notes)."""
    if hard and memory_limit_bytes > 0:
        return str(memory_limit_bytes)
    return "max"


def limit_files(
    cpu_limit_millicores: int, memory_limit_bytes: int, hard: bool
) -> tuple[tuple[str, str], ...]:
    """The files that carry a task's limits and what to write in each, in write order."""
    return (
        ("memory.max", memory_max(memory_limit_bytes, hard)),
        ("cpu.max", cpu_max(cpu_limit_millicores)),
    )


def cgroup_name(task_name: str) -> str:
    """A directory name for a task's cgroup (``job/3#2`` -> ``job_3_2``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task_name)


def enable_controllers_line(enabled: frozenset[str]) -> str:
    """What to write to ``cgroup.subtree_control`` to add the required controllers ('' if none)."""
    return " ".join(f"+{name}" for name in REQUIRED_CONTROLLERS if name not in enabled)


# ----- file contents -> values -------------------------------------------------------------------


def parse_flat_keyed(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file (``key value`` per line: cpu.stat, memory.events)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def parse_controllers(text: str) -> frozenset[str]:
    """``cgroup.controllers`` / ``cgroup.subtree_control``: space-separated names."""
    return frozenset(text.split())


def parse_bytes_value(text: str) -> int | None:
    """A single-value memory file (memory.current, memory.peak, memory.max); None for ``max``."""
    value = text.strip()
    if value == "max":
        return None
    return int(value)


@dataclass(frozen=True)
class CpuStat:
    usage_usec: int = 0
    nr_periods: int = 0
    nr_throttled: int = 0  # enforcement periods in which the cgroup was throttled
    throttled_usec: int = 0


def parse_cpu_stat(text: str) -> CpuStat:
    return _flat_keyed_record(CpuStat, text)


@dataclass(frozen=True)
class MemoryEvents:
    high: int = 0
    max: int = 0  # times usage was about to go over memory.max
    oom: int = 0  # times the cgroup hit its limit and reclaim failed
    oom_kill: int = 0  # processes the kernel's OOM killer killed in it


R = TypeVar("R", CpuStat, MemoryEvents)


def parse_memory_events(text: str) -> MemoryEvents:
    return _flat_keyed_record(MemoryEvents, text)


def _flat_keyed_record(record: type[R], text: str) -> R:
    """A flat-keyed file as a dataclass whose field names are the file's keys (absent keys: 0)."""
    values = parse_flat_keyed(text)
    return record(**{f.name: values.get(f.name, 0) for f in fields(record)})


# ----- where the hierarchy is ----------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupMounts:
    """What ``/proc/self/mountinfo`` says about cgroups."""

    v2_mount: str | None = None  # where the (first) cgroup2 filesystem is mounted
    v2_root: str = "/"  # the part of the hierarchy that mount shows
    v2_read_only: bool = False
    v1_controllers: frozenset[str] = frozenset()  # controllers bound to cgroup v1 hierarchies


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> CgroupMounts:
    """Find the cgroup2 mount and the controllers held by cgroup v1 hierarchies.

    A line is ``id parent major:minor root mount-point options [optional...] - fstype source
    super-options`` (proc(5)).
    """
    v2: tuple[str, str, bool] | None = None
    v1: set[str] = set()
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        fields, rest = head.split(), tail.split()
        if len(fields) < 6 or len(rest) < 3:
            continue
        fstype, super_options = rest[0], rest[2].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = (_unescape(fields[4]), _unescape(fields[3]), "ro" in fields[5].split(","))
        elif fstype == "cgroup":
            v1.update(option for option in super_options if option in _V1_CONTROLLERS)
    if v2 is None:
        return CgroupMounts(v1_controllers=frozenset(v1))
    return CgroupMounts(v2[0], v2[1], v2[2], frozenset(v1))


def own_cgroup_path(proc_self_cgroup: str) -> str | None:
    """The process's cgroup v2 path (the ``0::/path`` line of /proc/self/cgroup), or None."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def own_cgroup_dir(mounts: CgroupMounts, own_path: str | None) -> str | None:
    """The directory of the process's own cgroup under the cgroup2 mount (None if not visible)."""
    if mounts.v2_mount is None or own_path is None:
        return None
    root = mounts.v2_root.rstrip("/")
    if root and own_path != root and not own_path.startswith(root + "/"):
        return None
    relative = own_path[len(root) :].strip("/")
    return f"{mounts.v2_mount.rstrip('/')}/{relative}".rstrip("/") if relative else mounts.v2_mount


# ----- may the Borglet use it? ----------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupProbe:
    """What the Borglet found out about cgroups at start (the facts the decision rests on)."""

    setting: str  # CELLPILOT_BORGLET_CGROUP_ROOT: "" = find it, "none" = do not use, else a directory
    mounts: CgroupMounts
    parent: str | None  # the directory the Borglet's task cgroups would go under
    controllers: frozenset[str] | None  # the parent's cgroup.controllers (None: unreadable)
    euid: int
    setup_error: str = ""  # "" unless creating the subtree failed (see describe_setup_error)


ENFORCED_BY_KERNEL = (
    "memory: hard limits by the kernel (memory.max; its OOM kills are reported from memory.events), "
    "soft limits by the Borglet under machine memory pressure; CPU: capped by the kernel (cpu.max), "
    "throttling read from cpu.stat"
)
ENFORCED_BY_METERING = (
    "memory: the Borglet's metering OOM-kills a task once a sample shows it over its hard limit "
    "(between samples it can go over), soft limits under machine memory pressure; CPU: not capped, "
    "use above the limit is only recorded as throttling"
)


@dataclass(frozen=True)
class CgroupDecision:
    usable: bool
    missing: tuple[str, ...]  # what stops the Borglet from using cgroup v2, each in words
    parent: str | None = None

    @property
    def mode(self) -> str:
        """The machine attribute value naming who enforces limits."""
        return "cgroup-v2" if self.usable else "borglet-metering"

    @property
    def enforced(self) -> str:
        return ENFORCED_BY_KERNEL if self.usable else ENFORCED_BY_METERING


def decide(probe: CgroupProbe) -> CgroupDecision:
    """Whether task limits can be enforced with cgroup v2 and, if not, exactly what is missing."""
    if probe.setting == "none":
        return CgroupDecision(False, ("cgroups are turned off (CELLPILOT_BORGLET_CGROUP_ROOT=none)",))
    missing: list[str] = []
    mounts = probe.mounts
    v1 = sorted(mounts.v1_controllers)
    if not probe.setting and mounts.v2_mount is None:
        detail = f" (cgroup v1 only: {', '.join(v1)})" if v1 else ""
        return CgroupDecision(False, (f"no cgroup2 filesystem is mounted{detail}",))
    if probe.parent is None:
        return CgroupDecision(
            False, ("the Borglet's own cgroup is not visible under the cgroup2 mount (/proc/self/cgroup)",)
        )
    if not probe.setting and mounts.v2_read_only:
        missing.append(f"the cgroup2 filesystem at {mounts.v2_mount} is mounted read-only")
    if probe.controllers is None:
        missing.append(f"{probe.parent} is not a cgroup v2 directory (no readable cgroup.controllers)")
    else:
        absent = [name for name in REQUIRED_CONTROLLERS if name not in probe.controllers]
        if absent:
            offered = " ".join(sorted(probe.controllers)) or "nothing"
            if set(absent) <= mounts.v1_controllers:
                why = "they are bound to cgroup v1 hierarchies (a hybrid cgroup layout)"
            else:
                why = "they are not delegated to this subtree"
            missing.append(
                f"the {' and '.join(absent)} controller{'s' if len(absent) > 1 else ''} "
                f"{'are' if len(absent) > 1 else 'is'} not available in {probe.parent} "
                f"(cgroup.controllers offers: {offered}): {why}"
            )
    if probe.setup_error:
        missing.append(probe.setup_error)
    return CgroupDecision(not missing, tuple(missing), probe.parent)


def describe_setup_error(path: str, code: int, euid: int) -> str:
    """Why writing ``path`` while creating the Borglet's cgroup subtree failed, in words."""
    name = errno.errorcode.get(code, str(code))
    if code == errno.EBUSY:
        return (
            f"cannot enable controllers in {path} ({name}): that cgroup holds processes other than the "
            "Borglet, and cgroup v2 gives controllers to child cgroups only from a cgroup without "
            "processes of its own; run the Borglet in a delegated cgroup of its own or set "
            "CELLPILOT_BORGLET_CGROUP_ROOT to an empty delegated cgroup"
        )
    if code == errno.EROFS:
        return f"cannot write {path} ({name}): the cgroup filesystem is read-only"
    if code in (errno.EACCES, errno.EPERM):
        who = (
            "even as root"
            if euid == 0
            else f"as uid {euid} (not root, and the subtree is not delegated to it)"
        )
        return f"cannot write {path} ({name}) {who}"
    return f"cannot write {path} ({name})"


@dataclass(frozen=True)
class CgroupUsage:
    """One reading of a task's cgroup."""

    memory_current: int  # bytes charged to the cgroup now (what memory.max limits)
    memory_peak: int | None  # the highest memory.current seen (None: kernel without memory.peak)
    cpu: CpuStat
    memory_events: MemoryEvents


def parse_usage(files: Mapping[str, str]) -> CgroupUsage:
    """A reading from the contents of memory.current, memory.peak, cpu.stat and memory.events."""
    peak = files.get("memory.peak")
    return CgroupUsage(
        memory_current=parse_bytes_value(files.get("memory.current", "0")) or 0,
        memory_peak=parse_bytes_value(peak) if peak is not None else None,
        cpu=parse_cpu_stat(files.get("cpu.stat", "")),
        memory_events=parse_memory_events(files.get("memory.events", "")),
    )
