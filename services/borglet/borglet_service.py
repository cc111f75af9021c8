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
from cellpilot.platform.grpc_server import GrpcServer, ServiceBinding
from cellpilot.platform.kafka import MessageProducer
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.borglet import convert
from cellpilot_services.borglet.convert import MachineProfile, RuntimeDefaults
from cellpilot_services.borglet.event_clock import EventClock
from cellpilot_services.borglet.fleet import Fleet, FleetOptions
from cellpilot_services.borglet.machine_agent import MachineAgent
from cellpilot_services.borglet.process_runtime import CgroupCpu, ProcessRunner
from cellpilot_services.borglet.registration import BorgmasterLocator, register_all
from cellpilot_services.borglet.sample_publisher import SamplePublisher
from cellpilot_services.borglet.servicer import BorgletServicer
from cellpilot_services.borglet.settings import BorgletSettings
from cellpilot_services.borglet.task_record import Limits

log = logging.getLogger(__name__)


def machine_profiles(settings: BorgletSettings) -> list[MachineProfile]:
    capacity = Limits(settings.cpu_millicores, settings.memory_bytes, settings.disk_bytes, settings.ports)
    replica = settings.replica_index
    per_rack = settings.machines_per_rack
    per_domain = per_rack * settings.racks_per_power_domain
    return [
        MachineProfile(
            machine_id=machine_id,
            capacity=capacity,
            attributes=dict(settings.attributes),
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
        self.clock = EventClock(settings.speedup, settings.event_start_ms)
        self.profiles = machine_profiles(settings)
        # Event and batch sequences start at this boot's event time in µs (see MachineAgent).
        first_sequence = self.clock.now_ms() * 1000
        self.machines = [
            MachineAgent(profile, i, first_sequence, settings.max_unacked_events)
            for i, profile in enumerate(self.profiles)
        ]
        work_dir = Path(settings.work_dir or Path(tempfile.gettempdir()) / "cellpilot-borglet") / self.boot_id
        cgroup = (
            CgroupCpu.detect(settings.cgroup_root, self.boot_id) if settings.allow_process_runtime else None
        )
        self.runner = ProcessRunner(work_dir, dict(settings.task_base_env), cgroup)
        self.publisher: SamplePublisher | None = None
        if settings.publish_samples:
            bootstrap = settings.platform.kafka_bootstrap
            self.publisher = SamplePublisher(
                lambda: MessageProducer(bootstrap, client_id=f"borglet-{settings.replica_index}"),
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
        self.port = 0
        self.address = ""
        self.registered = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[object]] = []

    async def start(self) -> int:
        """Serve, run the event-time loop and the publisher, and register with the Borgmaster."""
        self.port = await self.server.start()
        self.address = f"{self.settings.advertise_host}:{self.port}"
        self._tasks.append(asyncio.create_task(self.fleet.run(self._stop)))
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

    async def stop(self) -> None:
        self._stop.set()
        await self.server.stop(1.0)
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=10)
        await self.fleet.shutdown(self.settings.kill_tasks_on_exit)
        if self.publisher is not None:
            await self.publisher.close()
        await self.locator.close()


async def serve(settings: BorgletSettings, stop: asyncio.Event, telemetry: Telemetry | None = None) -> None:
    borglet = Borglet(settings, telemetry)
    await borglet.start()
    try:
        await stop.wait()
    finally:
        await borglet.stop()
