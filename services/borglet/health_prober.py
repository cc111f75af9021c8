"""Running process tasks' health checks (Borg §2.6): the Borglet's async shell around the rules of
:mod:`cellpilot.borg.health_checks`.

Every running process task that declares a check is probed every ``interval_ms`` (wall:
the check probes a real process), first ``initial_delay_ms`` after the Borglet started it:
an HTTP GET of its URL on this machine (2xx/3xx passes), or its command run as the task
(exit 0 passes), each within ``timeout_ms``. The outcome is folded into the task's
:class:`~cellpilot.borg.health_checks.HealthState`: the first pass makes it ready (its poll
reports say so, so the Borgmaster and Autopilot's limiting growth see it initialised, §3.3);
``failure_threshold`` failures in a row fail it — the fleet kills it and reports FAILED with
the reason, and the Borgmaster's restart backoff applies (Borg §4). One task's probe never
holds up another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from urllib.parse import urlsplit

from cellpilot.borg.health_checks import ResolvedCheck, record_check
from cellpilot.borglet.hosted_task import HostedTask, ProcessPlan
from cellpilot.borglet.machine_agent import MachineAgent
from cellpilot.borglet.task_lifecycle import Phase
from cellpilot_services.borglet.fleet import Fleet
from cellpilot_services.borglet.process_runtime import ProcessHandle, ProcessRunner

log = logging.getLogger(__name__)

TICK_S = 0.1  # how often due checks are looked for
_NEXT = "health_next_check"  # HostedTask.extra: monotonic time the next check is due
_RUNNING = "health_probe"  # HostedTask.extra: the probe in flight


async def http_check(url: str, timeout_s: float) -> tuple[bool, str]:
    """GET ``url`` (an http:// URL on this machine); a 2xx or 3xx status passes."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    async def get() -> int:
        reader, writer = await asyncio.open_connection(host, parts.port)
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            status_line = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        fields = status_line.split()
        if len(fields) < 2 or not fields[1].isdigit():
            raise ValueError(f"not an HTTP response: {status_line[:60]!r}")
        return int(fields[1])

    try:
        status = await asyncio.wait_for(get(), timeout=timeout_s)
    except TimeoutError:
        return False, f"GET {url} did not answer within {timeout_s:g} s"
    except (OSError, ValueError) as error:
        return False, f"GET {url} failed: {error}"
    return 200 <= status < 400, f"GET {url} answered {status}"


class HealthProber:
    def __init__(self, fleet: Fleet, runner: ProcessRunner) -> None:
        self.fleet = fleet
        self.runner = runner
        self.probes: set[asyncio.Task[None]] = set()
        self.checks = 0

    def _due(self, now: float) -> list[tuple[MachineAgent, HostedTask, ResolvedCheck]]:
        due = []
        for machine, record in self.fleet.checked_tasks():
            runtime = record.plan.runtime
            if (
                record.phase is not Phase.RUNNING
                or not isinstance(runtime, ProcessPlan)
                or _RUNNING in record.extra
            ):
                continue
            check = runtime.health_check
            if check is None:
                continue
            next_at = record.extra.setdefault(_NEXT, now + check.initial_delay_seconds)
            if now >= next_at:
                due.append((machine, record, check))
        return due

    async def probe(self, machine: MachineAgent, record: HostedTask, check: ResolvedCheck) -> None:
        """One check of one task, and what follows from it."""
        started = time.monotonic()
        try:
            if check.http_url:
                passed, detail = await http_check(check.url_for(record.plan.ports), check.timeout_seconds)
            else:
                passed, detail = await self.runner.run_check(record, check.command, check.timeout_seconds)
        except Exception as error:  # a probe that cannot even run is a failed check
            passed, detail = False, f"{type(error).__name__}: {error}"
        finally:
            record.extra.pop(_RUNNING, None)
        self.checks += 1
        record.extra[_NEXT] = started + check.interval_seconds
        if record.phase is not Phase.RUNNING or not isinstance(record.process, ProcessHandle):
            return
        age_s = (self.fleet.clock.now_ms() - record.started_ms) / 1000.0 / self.fleet.clock.speedup
        was_ready = record.health.ready
        verdict = record_check(check, record.health, passed, detail, age_s)
        record.health = verdict.state
        if verdict.state.ready and not was_ready:
            log.info(
                "task ready: passed its health check", extra={"task": record.plan.name, "detail": detail}
            )
        if verdict.fail_task:
            self.fleet.fail_task(machine, record, verdict.detail, f"health:{record.plan.name}")

    def tick(self) -> None:
        for machine, record, check in self._due(time.monotonic()):
            task = asyncio.create_task(self.probe(machine, record, check))
            record.extra[_RUNNING] = task
            self.probes.add(task)
            task.add_done_callback(self.probes.discard)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("health check scheduling failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=TICK_S)
        for task in list(self.probes):
            task.cancel()
        await asyncio.gather(*self.probes, return_exceptions=True)
