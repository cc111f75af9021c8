"""A task that cannot run fails alone: its poll still answers, the other tasks keep running.

Driven through the Borglet's gRPC API as the Borgmaster drives it: one desired set holding a
good simulated task, a task whose plan the Borglet cannot read (an unknown usage model, as a
spec with a typo would carry if it got past admission), a task whose command does not exist
and a task with a bad environment. The poll answers OK; each bad task is reported DEAD with
exit reason FAILED and a reason naming what went wrong; the good tasks keep running and keep
being metered; the Borglet logs each failure at WARNING with the job, task and machine.
"""

from __future__ import annotations

import logging

import pytest
from borglet_builders import BorgletFactory, poll, poll_until, process_task, simulated_task, task_in

from cellpilot.api.v1 import borglet_pb2, job_pb2, state_pb2

RUNNING, DEAD = state_pb2.TASK_STATE_RUNNING, state_pb2.TASK_STATE_DEAD
FAILED = state_pb2.TASK_EVENT_KIND_FAILED
MIB = 1 << 20


def _command(job_id: str, command: str, env: dict[str, str] | None = None) -> borglet_pb2.TaskAssignment:
    return borglet_pb2.TaskAssignment(
        job_id=job_id,
        task_index=0,
        incarnation=1,
        spec_version=1,
        spec=job_pb2.TaskSpec(
            runtime=job_pb2.RuntimeSpec(
                process=job_pb2.ProcessRuntime(command=command, args=["x"], env=env or {})
            )
        ),
    )


async def test_bad_tasks_in_a_desired_set_fail_alone_and_the_poll_answers(
    borglet_factory: BorgletFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellpilot_services.borglet")
    async with borglet_factory(publish_samples=False, memory_bytes=4 << 30) as (borglet, stub):
        machine = borglet.profiles[0].machine_id
        desired = borglet_pb2.DesiredTasks(
            version=3,
            tasks=[
                simulated_task("u/good", 0, params={"memory_bytes": 50 * MIB}),
                simulated_task("u/typo", 0, model="nope"),
                simulated_task("u/param", 0, model="diurnal", params={"base_cpu_millicores": 300}),
                _command("u/missing", "/nonexistent/cellpilot-no-such-binary"),
                _command("u/env", "/bin/true", {"A\0B": "1"}),
                process_task("u/proc", "120s:20MiB:50m", 500 * MIB),
            ],
        )
        report = await poll(stub, machine, desired=desired)  # answers: no INVALID_ARGUMENT
        assert report.desired_version == 3
        reasons = {
            "u/typo": "desired.tasks[1].spec.runtime.simulated.usage_model",
            "u/param": "desired.tasks[2].spec.runtime.simulated.params",
            "u/missing": "could not start",
            "u/env": "could not start",
        }
        for job_id, words in reasons.items():
            task = task_in(report, job_id)
            assert (task.state, task.exit_reason) == (DEAD, FAILED), job_id
            event = next(e.event for e in report.events if e.event.job_id == job_id)
            assert (event.kind, event.state) == (FAILED, state_pb2.TASK_STATE_PENDING)
            assert words in event.detail, event.detail
        # The good tasks run, and keep being metered while the failed ones stay dead.
        later = await poll_until(
            stub,
            machine,
            lambda r: (
                task_in(r, "u/good").usage.memory_bytes > 0
                and task_in(r, "u/proc").usage.memory_bytes > 10 * MIB
            ),
        )
        assert task_in(later, "u/good").state == RUNNING
        assert task_in(later, "u/proc").state == RUNNING
        # The same desired set again starts nothing new: a failed incarnation stays failed.
        again = await poll(stub, machine, desired=desired)
        assert task_in(again, "u/typo").incarnation == 1
        assert task_in(again, "u/typo").state == DEAD
    warnings = [r for r in caplog.records if r.getMessage() == "task failed on its machine"]
    assert {r.job_id for r in warnings} >= set(reasons)  # type: ignore[attr-defined]
    assert all(r.machine_id == machine and r.task_index == 0 for r in warnings)  # type: ignore[attr-defined]
