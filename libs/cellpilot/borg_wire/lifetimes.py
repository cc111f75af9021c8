"""Wire conversions of the lifetime-aware parts (LAVA paper): host states, the model record,
task lifetimes and drain plans, between ``lifetimes.proto`` / ``checkpoint.proto`` and the core.

Kept apart from :mod:`convert` (the request/response edge of jobs, tasks and machines); like it,
this is the only place these protobuf types meet the core's dataclasses (docs/architecture.md
rule 2). Lifetime classes are 0..3 (LC1..LC4) and -1 (none) in the core and 1..4 / 0 on the wire.
"""

from __future__ import annotations

from cellpilot.api.v1 import checkpoint_pb2, lifetimes_pb2
from cellpilot.borg import mutations as mu
from cellpilot.borg.task_lifetimes import DrainPlan, TaskLifetime, class_name
from cellpilot.schedule.lifetime_aware.lava import EMPTY, OPEN, RECYCLING

_STATE_OUT = {
    EMPTY: lifetimes_pb2.LAVA_HOST_STATE_EMPTY,
    OPEN: lifetimes_pb2.LAVA_HOST_STATE_OPEN,
    RECYCLING: lifetimes_pb2.LAVA_HOST_STATE_RECYCLING,
}
_STATE_IN = {v: k for k, v in _STATE_OUT.items()}


def lava_host_out(host: mu.LavaHost) -> lifetimes_pb2.LavaHost:
    return lifetimes_pb2.LavaHost(
        machine_id=host.machine_id,
        state=_STATE_OUT[host.state],
        lifetime_class=host.lifetime_class + 1,
        deadline_ms=host.deadline_ms,
        residual=[lifetimes_pb2.TaskRef(job_id=j, task_index=i) for j, i in host.residual],
    )


def lava_host_in(msg: lifetimes_pb2.LavaHost) -> mu.LavaHost:
    return mu.LavaHost(
        msg.machine_id,
        _STATE_IN.get(msg.state, EMPTY),
        msg.lifetime_class - 1,
        msg.deadline_ms,
        tuple((r.job_id, r.task_index) for r in msg.residual),
    )


def model_out(model: mu.LifetimeModelTrained) -> checkpoint_pb2.LifetimeModelTrained:
    return checkpoint_pb2.LifetimeModelTrained(
        model_json=model.model_json, runs=model.runs, trained_at_ms=model.trained_at_ms
    )


def model_in(msg: checkpoint_pb2.LifetimeModelTrained) -> mu.LifetimeModelTrained:
    return mu.LifetimeModelTrained(msg.model_json, msg.runs, msg.trained_at_ms)


def hosts_changed_out(m: mu.LavaHostsChanged) -> checkpoint_pb2.LavaHostsChanged:
    return checkpoint_pb2.LavaHostsChanged(hosts=[lava_host_out(h) for h in m.hosts])


def hosts_changed_in(msg: checkpoint_pb2.LavaHostsChanged) -> mu.LavaHostsChanged:
    return mu.LavaHostsChanged(tuple(lava_host_in(h) for h in msg.hosts))


def task_lifetime_out(lifetime: TaskLifetime | None) -> lifetimes_pb2.TaskLifetime:
    if lifetime is None:
        return lifetimes_pb2.TaskLifetime(predicted=False)
    return lifetimes_pb2.TaskLifetime(
        predicted=True,
        remaining_s=lifetime.remaining_s,
        lifetime_class=lifetime.lifetime_class + 1,
        class_name=class_name(lifetime.lifetime_class),
        uptime_s=lifetime.uptime_s,
    )


def drain_plan_out(machine_id: str, seq: int, plan: DrainPlan) -> lifetimes_pb2.DrainMachineResponse:
    return lifetimes_pb2.DrainMachineResponse(
        machine_id=machine_id,
        log_sequence=seq,
        order=plan.order,
        reason=plan.reason,
        moves=[
            lifetimes_pb2.DrainMove(
                task=lifetimes_pb2.TaskRef(job_id=key[0], task_index=key[1]),
                lifetime=task_lifetime_out(lifetime),
                rank=rank,
            )
            for rank, (key, lifetime) in enumerate(plan.moves, start=1)
        ],
    )
