"""Process tasks' health checks (Borg §2.6) and readiness (Autopilot §3.3), as pure rules.

Borg §2.6: "Almost every task run under Borg contains a built-in HTTP server that publishes
information about the health of the task ... Borg monitors the health-check URL and restarts
tasks that do not respond promptly or return an HTTP error code." Here a process task may
declare a check — an HTTP URL on its own machine or a command run as the task — that its
Borglet runs every ``interval_seconds``:

* a check passes on a 2xx/3xx answer (HTTP) or exit code 0 (command) within ``timeout_ms``;
* the task is **ready** from its first passing check on (until then it is initialising, which
  Autopilot's limiting-growth stabiliser counts, §3.3, and which no load balancer routes to);
* ``failure_threshold`` failures in a row **fail** the task: its Borglet kills it and reports
  it FAILED, and the Borgmaster reschedules it under its restart backoff (Borg §4);
* checks start ``initial_delay_ms`` after the task (its start-up); failures before the
  first pass count only once that delay is over.

Validation runs at admission (every field named, :func:`validate_health_check`), so the Borglet
only ever sees checks it can run. The URL may only name the task's own machine (127.0.0.1,
localhost or [::1]): a Borglet probes its tasks, never another host.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from cellpilot.borg.model import HealthCheck

DEFAULT_INTERVAL_MS = 10_000
DEFAULT_TIMEOUT_MS = 1_000
DEFAULT_FAILURE_THRESHOLD = 3
MAX_MS = 86_400_000
MAX_FAILURE_THRESHOLD = 1_000
MAX_URL_BYTES = 2_048
MAX_COMMAND_ARGS = 256
MAX_ARG_BYTES = 4_096
PORT_PLACEHOLDER = "{port}"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class ResolvedCheck:
    """A health check with its defaults filled in."""

    http_url: str
    command: tuple[str, ...]
    interval_seconds: float
    timeout_seconds: float
    failure_threshold: int
    initial_delay_seconds: float

    def url_for(self, ports: tuple[int, ...]) -> str:
        """The URL with ``{port}`` replaced by the task's first port (ValueError if it has none)."""
        if PORT_PLACEHOLDER not in self.http_url:
            return self.http_url
        if not ports:
            raise ValueError(f"the health check URL uses {PORT_PLACEHOLDER} but the task has no port")
        return self.http_url.replace(PORT_PLACEHOLDER, str(ports[0]))


def resolve(check: HealthCheck) -> ResolvedCheck:
    return ResolvedCheck(
        http_url=check.http_url,
        command=check.command,
        interval_seconds=(check.interval_ms or DEFAULT_INTERVAL_MS) / 1000.0,
        timeout_seconds=(check.timeout_ms or DEFAULT_TIMEOUT_MS) / 1000.0,
        failure_threshold=check.failure_threshold or DEFAULT_FAILURE_THRESHOLD,
        initial_delay_seconds=check.initial_delay_ms / 1000.0,
    )


def _url_problem(url: str) -> str:
    if len(url.encode()) > MAX_URL_BYTES:
        return f"must be at most {MAX_URL_BYTES} bytes"
    if any(c.isspace() or c == "\0" for c in url):
        return "must not contain whitespace or NUL"
    try:
        parts = urlsplit(url.replace(PORT_PLACEHOLDER, "1"))
        port = parts.port
    except ValueError as error:
        return f"is not a URL: {error}"
    if parts.scheme != "http":
        return f"must be an http:// URL, got scheme {parts.scheme or 'none'!r}"
    if (parts.hostname or "") not in LOOPBACK_HOSTS:
        return f"must name the task's own machine (127.0.0.1, localhost or [::1]), not {parts.hostname!r}"
    if port is None:
        return f"must name a port (a number, or {PORT_PLACEHOLDER} for the task's first port)"
    if url.count(PORT_PLACEHOLDER) > 1:
        return f"may use {PORT_PLACEHOLDER} once"
    return ""


def validate_health_check(check: HealthCheck, field: str) -> tuple[str, str] | None:
    """(field path, problem) for a check the Borglet could not run; None if it can."""
    if bool(check.http_url) == bool(check.command):
        return field, "needs exactly one of http_url or command"
    if check.http_url:
        problem = _url_problem(check.http_url)
        if problem:
            return f"{field}.http_url", problem
    if len(check.command) > MAX_COMMAND_ARGS:
        return f"{field}.command", f"at most {MAX_COMMAND_ARGS} arguments, got {len(check.command)}"
    for i, arg in enumerate(check.command):
        if "\0" in arg or len(arg.encode()) > MAX_ARG_BYTES or (i == 0 and not arg.strip()):
            return (
                f"{field}.command[{i}]",
                f"must be a non-empty string of at most {MAX_ARG_BYTES} bytes, no NUL",
            )
    for name in ("interval_ms", "timeout_ms", "initial_delay_ms"):
        value = getattr(check, name)
        if not 0 <= value <= MAX_MS:
            return f"{field}.{name}", f"must be in 0..{MAX_MS} ms, got {value}"
    if not 0 <= check.failure_threshold <= MAX_FAILURE_THRESHOLD:
        return (
            f"{field}.failure_threshold",
            f"must be in 0..{MAX_FAILURE_THRESHOLD}, got {check.failure_threshold}",
        )
    resolved = resolve(check)
    if resolved.timeout_seconds > resolved.interval_seconds:
        return f"{field}.timeout_ms", (
            f"{resolved.timeout_seconds:g} s is longer than the interval {resolved.interval_seconds:g} s"
        )
    return None


@dataclass(frozen=True)
class HealthState:
    """What a Borglet knows of one task's health: ready yet, and failures in a row."""

    ready: bool = False
    failures: int = 0
    checks: int = 0
    last_detail: str = ""


@dataclass(frozen=True)
class HealthVerdict:
    state: HealthState
    fail_task: bool  # the threshold is reached: the task has failed
    detail: str  # why, for the task's FAILED event


def record_check(
    check: ResolvedCheck, state: HealthState, passed: bool, detail: str, age_seconds: float
) -> HealthVerdict:
    """Fold one check's outcome (``age_seconds`` after the task started) into its state."""
    if passed:
        return HealthVerdict(HealthState(True, 0, state.checks + 1, detail), False, "")
    counted = state.ready or age_seconds >= check.initial_delay_seconds
    failures = state.failures + 1 if counted else state.failures
    new = HealthState(state.ready, failures, state.checks + 1, detail)
    if failures >= check.failure_threshold:
        why = f"health check failed {failures} times in a row (threshold {check.failure_threshold}): {detail}"
        return HealthVerdict(new, True, why)
    return HealthVerdict(new, False, "")
