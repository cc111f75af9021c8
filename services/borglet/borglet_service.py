"""Assembles a Borglet process: event clock, hosted machines, runtimes, publisher, gRPC server.

:class:`Borglet` is usable in-process (tests start it, read ``port``, and stop it);
:func:`serve` is what ``python -m cellpilot_services.borglet`` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import uuid
from pathlib import Path

from cellpilot.api.v1 import borglet_pb2_grpc
from cellpilot.borg.cgroup_v2 import CgroupDecision
from cellpilot.borglet.hosted_task import Limits
from cellpilot.borglet.machine_agent import MachineAgent, MachineProfile
from cellpilot.platform.grpc_server import GrpcServer, ServiceBinding
from cellpilot.platform.kafka import MessageProducer
from cellpilot.platform.service import run_until_stopped
from cellpilot.platform.system_accounts import RunAs
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.borglet import convert
from cellpilot_services.borglet.convert import RuntimeDefaults
from cellpilot_services.borglet.event_clock import ClockAnchor, EventClock
from cellpilot_services.borglet.fleet import Fleet, FleetOptions
from cellpilot_services.borglet.health_prober import HealthProber
from cellpilot_services.borglet.load_balancer_view import LoadBalancerView
from cellpilot_services.borglet.process_runtime import ProcessRunner
from cellpilot_services.borglet.registration import BorgmasterLocator, register_all
from cellpilot_services.borglet.sample_publisher import SamplePublisher
from cellpilot_services.borglet.servicer import BorgletServicer
from cellpilot_services.borglet.settings import BorgletSettings
from cellpilot_services.borglet.task_cgroups import TaskCgroups
from cellpilot_services.borglet.task_sandbox import make_interpreter_reachable, task_account

log = logging.getLogger(__name__)


# The machine attribute saying who enforces process tasks' limits: "cgroup-v2" (the kernel) or
# "borglet-metering" (the Borglet's own sampling), so the master, its users and constraints see it.
LIMIT_ENFORCEMENT_ATTRIBUTE = "limit_enforcement"


def machine_profiles(settings: BorgletSettings, limit_enforcement: str = "") -> list[MachineProfile]:
    capacity = Limits(settings.cpu_millicores, settings.memory_bytes, settings.disk_bytes, settings.ports)
    attributes = dict(settings.attributes)
    if limit_enforcement:
        attributes.setdefault(LIMIT_ENFORCEMENT_ATTRIBUTE, limit_enforcement)
    replica = settings.replica_index
    per_rack = settings.machines_per_rack
    per_domain = per_rack * settings.racks_per_power_domain
    return [
        MachineProfile(
            machine_id=machine_id,
            capacity=capacity,
            attributes=dict(attributes),
            rack=f"rack-r{replica}-{i // per_rack}",
            power_domain=f"power-r{replica}-{i // per_domain}",
            first_port=settings.first_port,
        )
        for i, machine_id in enumerate(settings.resolved_machine_ids())
    ]


class Borglet:
    def __init__(self, settings: BorgletSettings, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.boot_id = uuid.uuid4().hex[:12]
        self.anchor = ClockAnchor(Path(settings.clock_file)) if settings.clock_file else None
        resume_at = self.anchor.load() if self.anchor is not None else None
        self.clock = EventClock(settings.speedup, settings.event_start_ms, not_before_ms=resume_at)
        if resume_at is not None:
            log.info(
                "event clock resumes where the last boot left it",
                extra={"resume_at_ms": resume_at, "event_time_ms": self.clock.start_ms},
            )
        work_dir = Path(settings.work_dir or Path(tempfile.gettempdir()) / "cellpilot-borglet") / self.boot_id
        self.task_account, self.task_account_reason = RunAs(), ""
        self.cgroups: TaskCgroups | None = None
        self.enforcement = CgroupDecision(False, ("the process runtime is turned off",))
        if settings.allow_process_runtime:
            self.task_account, self.task_account_reason = task_account(settings.task_user)
            self.cgroups, self.enforcement = TaskCgroups.detect(settings.cgroup_root, self.boot_id)
        self.runner = ProcessRunner(work_dir, dict(settings.task_base_env), self.cgroups, self.task_account)
        self.profiles = machine_profiles(settings, self.enforcement.mode)
        # Event and batch sequences start at this boot's event time in µs (see MachineAgent).
        first_sequence = self.clock.now_ms() * 1000
        self.machines = [
            MachineAgent(profile, i, first_sequence, settings.max_unacked_events)
            for i, profile in enumerate(self.profiles)
        ]
        self.publisher: SamplePublisher | None = None
        if settings.publish_samples:
            # Signed as this Borglet's identity, whose certificate names the machines it hosts.
            access = settings.stream_access()
            self.publisher = SamplePublisher(
                lambda: MessageProducer(access, client_id=f"borglet-{settings.replica_index}"),
                [p.machine_id for p in self.profiles],
                first_sequence,
                interval_s=settings.publish_interval_s,
                max_samples_per_batch=settings.max_samples_per_batch,
                max_buffered_samples=settings.max_buffered_samples,
                tracer=telemetry.tracer if telemetry else None,
            )
        self.fleet = Fleet(
            self.machines,
            self.clock,
            self.runner,
            self.publisher,
            FleetOptions(
                pressure_fraction=settings.memory_pressure_fraction,
                meter_interval_s=settings.meter_interval_s,
            ),
        )
        defaults = RuntimeDefaults(
            settings.default_runtime, settings.default_usage_model, settings.allow_process_runtime
        )
        self.servicer = BorgletServicer(self.fleet, defaults)
        self.server = GrpcServer(
            [
                ServiceBinding(
                    "cellpilot.api.v1.Borglet", borglet_pb2_grpc.add_BorgletServicer_to_server, self.servicer
                )
            ],
            address=settings.listen_address,
            **settings.security.server_options(settings.resolved_identity()),
        )
        self.locator = BorgmasterLocator(
            settings.borgmaster_addresses,
            settings.security.channel_credentials(settings.resolved_identity()),
            settings.security.service_metadata(settings.resolved_identity()),
        )
        # Who shares each job's demand: the Borgmaster's view of its ready tasks (Borg §2.6).
        self.balancer: LoadBalancerView | None = None
        if settings.borgmaster_addresses:
            self.balancer = LoadBalancerView(
                self.locator,
                self.fleet.demand_jobs,
                lambda: self.fleet.routing_changed(self.balancer.view if self.balancer else None),
                settings.load_balancer_refresh_s,
            )
            self.fleet.routing_changed({})
        self.prober = HealthProber(self.fleet, self.runner)
        self.port = 0
        self.address = ""
        self.registered = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[object]] = []

    async def start(self) -> int:
        """Serve, run the event-time loop and the publisher, and register with the Borgmaster."""
        self._report_task_isolation()
        self.port = await self.server.start()
        self.address = f"{self.settings.advertise_host}:{self.port}"
        self._tasks.append(asyncio.create_task(self.fleet.run(self._stop)))
        if self.anchor is not None:
            self._tasks.append(asyncio.create_task(self._keep_anchor()))
        self._tasks.append(asyncio.create_task(self.prober.run(self._stop)))
        if self.balancer is not None:
            self._tasks.append(asyncio.create_task(self.balancer.run(self._stop)))
        if self.publisher is not None:
            self._tasks.append(asyncio.create_task(self.publisher.run(self._stop)))
        if self.settings.borgmaster_addresses:
            self._tasks.append(asyncio.create_task(self._register()))
        log.info(
            "borglet serving",
            extra={
                "address": self.address,
                "machines": len(self.machines),
                "speedup": self.clock.speedup,
                "boot_id": self.boot_id,
            },
        )
        return self.port

    def _report_task_isolation(self) -> None:
        """Say at start as whom process tasks run and who enforces their limits (Borg §6.2)."""
        if not self.settings.allow_process_runtime:
            return
        log.info(f"process tasks run as {self.task_account_reason}")
        reachable = make_interpreter_reachable(self.task_account)
        if reachable:
            log.warning(
                "gave every user directory search permission (no listing, no reading) on "
                f"{', '.join(str(path) for path in reachable)} so the task user can run this Python"
            )
        decision = self.enforcement
        if self.cgroups is not None:
            log.info(
                f"cgroup v2 enforcement under {self.cgroups.base}: {decision.enforced}",
                extra={LIMIT_ENFORCEMENT_ATTRIBUTE: decision.mode},
            )
        else:
            log.warning(
                f"cgroup v2 enforcement unavailable: {'; '.join(decision.missing)}. "
                f"Enforced instead: {decision.enforced}",
                extra={LIMIT_ENFORCEMENT_ATTRIBUTE: decision.mode},
            )

    async def _register(self) -> int:
        specs = [convert.machine_spec(profile, self.address) for profile in self.profiles]
        self.registered = await register_all(
            self.locator,
            specs,
            self.boot_id,
            self._stop,
            self.settings.register_backoff_initial_s,
            self.settings.register_backoff_max_s,
        )
        return self.registered

    async def _keep_anchor(self) -> None:
        """Save, ahead of time, an event time this boot will not have reached by the next save.

        Saved at ``now + 2 intervals`` of event time: after a crash the next boot resumes past
        every sample and sequence this one produced (a clean stop saves the exact time).
        """
        assert self.anchor is not None
        interval = self.settings.clock_save_interval_s
        while not self._stop.is_set():
            await asyncio.to_thread(self.anchor.save, self.clock.now_ms() + self.clock.ms_in(2 * interval))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval)

    async def stop(self) -> None:
        self._stop.set()
        await self.server.stop(1.0)
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=10)
        if self.anchor is not None:
            self.anchor.save(self.clock.now_ms())
        await self.fleet.shutdown(self.settings.kill_tasks_on_exit)
        if self.cgroups is not None and self.settings.kill_tasks_on_exit:
            self.cgroups.close()
        if self.publisher is not None:
            await self.publisher.close()
        await self.locator.close()


async def serve(settings: BorgletSettings, stop: asyncio.Event, telemetry: Telemetry | None = None) -> None:
    await run_until_stopped(Borglet(settings, telemetry), stop)
