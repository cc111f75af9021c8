"""Who shares a job's demand on a Borglet: the load balancer's view of the job from the Borgmaster
(services/borglet/load_balancer_view.py) and the world table built from it (fleet_ticks.build_table)."""

from __future__ import annotations

import numpy as np

from cellpilot.api.v1 import job_pb2, state_pb2
from cellpilot.borglet.fleet_ticks import JobRouting, MachineShape, build_table
from cellpilot.borglet.hosted_task import HostedTask, Limits, SimulatedPlan, TaskPlan
from cellpilot.borglet.task_lifecycle import Phase
from cellpilot.world.job_demand import JobDemand
from cellpilot_services.borglet.load_balancer_view import routing_of

DEMAND = JobDemand.build("steady", {"cpu_millicores": 3000.0}, imbalance=0.4, seed=2)
SHAPE = MachineShape(np.full(2, 8000.0), np.full(2, 1e12), 0.95)


def _record(index: int, demand: JobDemand | None = DEMAND, startup: int = 30) -> HostedTask:
    runtime = SimulatedPlan("steady", (), seed=2, startup_seconds=startup, demand=demand)
    plan = TaskPlan("u/front", index, 1, 9, 2, Limits(1000, 1 << 30), True, runtime)
    return HostedTask("m0", plan, Phase.RUNNING, started_ms=1_000_000 + index * 1000)


def test_the_view_routes_to_running_ready_tasks_within_the_task_count() -> None:
    status = state_pb2.JobStatus(job_id="u/front", spec=job_pb2.JobSpec(task_count=3), submitted_ms=5_000)
    running, pending = state_pb2.TASK_STATE_RUNNING, state_pb2.TASK_STATE_PENDING
    for index, state, ready in [
        (0, running, True),
        (1, running, False),
        (2, pending, False),
        (3, running, True),
    ]:
        status.tasks.add(task_index=index, state=state, ready=ready)
    assert routing_of(status) == JobRouting(5.0, frozenset({0}))


def test_tasks_here_take_traffic_as_the_view_says_and_the_rest_weigh_in_from_elsewhere() -> None:
    rows = [_record(0), _record(2), _record(5)]
    view = {"u/front": JobRouting(4.0, frozenset({0, 1, 2, 3}))}
    table = build_table(rows, [0, 0, 1], SHAPE, view)
    (group,) = table.demands
    assert group.rows.tolist() == [0, 1, 2]
    assert group.task_index.tolist() == [0, 2, 5]
    # Ready in the view: routed from the start; task 5 is not (yet): never.
    assert group.routed_from_s.tolist() == [-np.inf, -np.inf, np.inf]
    assert group.other_weight == float(DEMAND.weights([1, 3]).sum())
    assert group.origin_s == 4.0
    assert table.cpu_capacity is not None
    assert table.cpu_capacity.tolist() == [8000.0, 8000.0]


def test_a_job_the_view_does_not_know_yet_takes_no_traffic_here() -> None:
    (group,) = build_table([_record(0)], [0], SHAPE, {}).demands
    assert group.routed_from_s.tolist() == [np.inf]


def test_without_a_borgmaster_the_local_tasks_share_the_demand_once_past_their_start_up() -> None:
    table = build_table([_record(0), _record(1), _record(2, demand=None)], [0, 0, 1], SHAPE, None)
    (group,) = table.demands
    assert group.rows.tolist() == [0, 1]
    assert group.routed_from_s.tolist() == [1_030.0, 1_031.0]
    assert group.other_weight == 0.0
