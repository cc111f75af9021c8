"""How a simulated job's load balancer sees the job: which of its tasks take traffic.

A job's demand is shared by its ready tasks (:mod:`cellpilot.world.job_demand`), which may
run on many machines hosted by many Borglet processes. Each Borglet must split it the same
way, so it reads the job the way a real load balancer does: from the cell's naming service,
where "Borg also writes job size and task health information ... so load balancers can see
where to route requests to" (Borg §2.6). Here that is the Borgmaster's job status: every
``refresh_s`` (wall) this Borglet asks the elected master (``GetJob`` with tasks; a follower
names it in its trailing metadata) about each job with a shared demand that it hosts, and
keeps, per job, its submission time and the indices of its tasks that are RUNNING and ready
(within its task count). The master learns readiness from the Borglets' poll reports, so a new
task takes traffic from the refresh after the poll that saw it ready — as behind a real
balancer — and a task that died keeps its share until the master notices (that share is lost).

If the master cannot be reached the last view stays (a balancer keeps routing). A Borglet with
no Borgmaster configured has no view: each job's tasks on this Borglet share its demand once
past their start-up (see :func:`cellpilot.borglet.fleet_ticks.build_table`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

import grpc

from cellpilot.api.v1 import borgmaster_pb2, state_pb2
from cellpilot.borglet.fleet_ticks import JobRouting
from cellpilot.platform.error_reasons import leader_named
from cellpilot_services.borglet.registration import CALL_TIMEOUT_S, BorgmasterLocator

log = logging.getLogger(__name__)


def routing_of(status: state_pb2.JobStatus) -> JobRouting:
    """The balancer's view of a job status: its running, ready tasks within its task count."""
    ready = frozenset(
        t.task_index
        for t in status.tasks
        if t.task_index < status.spec.task_count and t.state == state_pb2.TASK_STATE_RUNNING and t.ready
    )
    return JobRouting(status.submitted_ms / 1000.0, ready)


class LoadBalancerView:
    def __init__(
        self,
        locator: BorgmasterLocator,
        jobs: Callable[[], set[str]],
        on_change: Callable[[], None],
        refresh_s: float = 1.0,
        concurrency: int = 16,
    ) -> None:
        """``jobs``: the jobs with a shared demand hosted here now; ``on_change``: called when a view
        changed (the fleet rebuilds its task table)."""
        self.locator = locator
        self.jobs = jobs
        self.on_change = on_change
        self.refresh_s = refresh_s
        self.concurrency = concurrency
        self.routing: dict[str, JobRouting] = {}
        self.refreshes = 0
        self.failures = 0

    @property
    def view(self) -> Mapping[str, JobRouting]:
        return self.routing

    async def _get(self, job_id: str) -> state_pb2.JobStatus | None:
        request = borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True)
        queue = self.locator.round()
        tried: set[str] = set()
        while queue:
            address = queue.popleft()
            if address in tried:
                continue
            tried.add(address)
            try:
                call = self.locator.stub(address).GetJob(
                    request, timeout=CALL_TIMEOUT_S, metadata=self.locator.metadata
                )
                response = await call
                leader = leader_named(await call.trailing_metadata())
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                continue
            if leader and leader != address and leader not in tried:
                queue.appendleft(leader)  # a follower's copy lacks readiness: ask the master
                continue
            self.locator.leader = address
            return response.job
        raise ConnectionError("no Borgmaster replica answered")

    async def refresh(self) -> None:
        """Read every hosted job with a shared demand once; keep the last view of those that fail."""
        wanted = self.jobs()
        gate = asyncio.Semaphore(self.concurrency)

        async def one(job_id: str) -> tuple[str, JobRouting | None, bool]:
            async with gate:
                try:
                    status = await self._get(job_id)
                except ConnectionError:
                    return job_id, self.routing.get(job_id), False
                return job_id, (routing_of(status) if status is not None else None), True

        results = await asyncio.gather(*(one(job_id) for job_id in sorted(wanted)))
        fresh: dict[str, JobRouting] = {}
        for job_id, routing, answered in results:
            self.failures += 0 if answered else 1
            if routing is not None:
                fresh[job_id] = routing
        self.refreshes += 1
        if fresh != self.routing:
            self.routing = fresh
            self.on_change()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception:
                log.exception("load balancer view refresh failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.refresh_s)
