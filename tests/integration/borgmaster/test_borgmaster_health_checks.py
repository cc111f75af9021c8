"""Health checks on the embedded stack (Borg §2.6, Autopilot §3.3): a real Borgmaster and Borglet.

* A process task serving HTTP on its assigned port, with a health-check URL, is RUNNING but not
  ready while its checks have not started (its start-up), and ready — in the Borgmaster's task
  view, learnt from the Borglet's poll reports — once a check passes.
* A process task whose health-check command keeps failing is failed by its Borglet after
  ``failure_threshold`` failures in a row; the Borgmaster counts the failure, reschedules it
  under its restart backoff (Borg §4) and it fails the same way again. It is never ready.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from borgmaster_harness import MIB, borglet, eventually, grant, leader_of, replicas, simulated_job, stub

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, state_pb2
from cellpilot.stack import StackEndpoints

RUNNING = state_pb2.TASK_STATE_RUNNING
SERVE = (
    "import os, http.server as h; "
    "port = int(os.environ['CELLPILOT_TASK_PORTS'].split(',')[0]); "
    "h.ThreadingHTTPServer(('127.0.0.1', port), h.SimpleHTTPRequestHandler).serve_forever()"
)


def _process_job(name: str, user: str, command: str, args: list[str], check: job_pb2.HealthCheck) -> Any:
    spec = simulated_job(name, user=user, cpu=100, memory=256 * MIB)
    spec.task.limits.ports = 1
    spec.task.runtime.Clear()
    spec.task.runtime.process.command = command
    spec.task.runtime.process.args.extend(args)
    spec.task.runtime.process.health_check.CopyFrom(check)
    return spec


async def _task(client: Any, job_id: str) -> Any:
    return (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True))).job.tasks[0]


async def test_a_task_is_ready_after_its_first_passing_check_and_one_failing_its_checks_is_restarted(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    async with replicas(fresh_database_url, endpoints, 1) as (master,):
        await leader_of([master])
        async with borglet(endpoints, [master.address], fleet_size=1):
            channel, client = stub(master.address)
            async with channel:
                await grant(client, user)
                http_check = job_pb2.HealthCheck(
                    http_url="http://127.0.0.1:{port}/",
                    interval_ms=300,
                    timeout_ms=250,
                    initial_delay_ms=2_500,
                )
                web = _process_job("web", user, sys.executable, ["-c", SERVE], http_check)
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(spec=web))
                failing_check = job_pb2.HealthCheck(
                    command=["false"], interval_ms=1000, timeout_ms=1000, failure_threshold=2
                )
                stuck = _process_job("stuck", user, "sleep", ["600"], failing_check)
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(spec=stuck))

                seen: list[tuple[int, bool]] = []

                async def web_ready() -> Any:
                    task = await _task(client, f"{user}/web")
                    seen.append((task.state, task.ready))
                    return task if task.state == RUNNING and task.ready else None

                ready = await eventually(web_ready, 30, "the HTTP task ready")
                # It ran before it was ready: initialising during its start-up (Autopilot §3.3).
                assert (RUNNING, False) in seen
                assert ready.failures == 0

                async def failed_twice() -> Any:
                    task = await _task(client, f"{user}/stuck")
                    return task if task.failures >= 2 else None

                failed = await eventually(failed_twice, 40, "the failing task failed twice")
                assert "health check failed 2 times in a row" in failed.last_failure
                assert "exited with code 1" in failed.last_failure
                assert not failed.ready
                events = await client.GetTask(
                    borgmaster_pb2.GetTaskRequest(job_id=f"{user}/stuck", task_index=0)
                )
                failures = [e for e in events.recent_events if e.kind == state_pb2.TASK_EVENT_KIND_FAILED]
                assert len(failures) >= 2
                assert all("health check" in e.detail for e in failures)
                # The healthy task was left alone throughout.
                still = await _task(client, f"{user}/web")
                assert (still.state, still.ready, still.incarnation) == (RUNNING, True, ready.incarnation)
