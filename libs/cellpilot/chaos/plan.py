"""What a chaos run does, in order: the faults and how long it gives the system around them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

FaultKind = Literal["kill-service", "restart-component", "poison-jobs", "forge-records"]


@dataclass(frozen=True)
class Fault:
    """One fault. ``target`` is a service (``kill-service``: ``replica`` None = its elected
    master) or an embedded component (``restart-component``: killed, the supervisor starts it
    again); ``poison-jobs`` submits the poison and crash-looping jobs, which ``with_poison``
    also does while another fault lasts; ``forge-records`` writes forged and replayed records
    with a plain Kafka client (:mod:`cellpilot.chaos.forger`)."""

    name: str  # as it appears in figure names, e.g. "kill_borgmaster_master"
    kind: FaultKind
    target: str = ""
    replica: int | None = None
    with_poison: bool = False

    @property
    def description(self) -> str:
        if self.kind == "kill-service":
            which = "the elected master" if self.replica is None else f"replica {self.replica}"
            return f"SIGKILL {self.target} ({which})" + (
                " and submit the poison jobs" if self.with_poison else ""
            )
        if self.kind == "restart-component":
            return f"SIGKILL {self.target}; the supervisor restarts it"
        if self.kind == "forge-records":
            return (
                "forge actuations (fencing token 10^12), samples and recommendations; replay genuine records"
            )
        return "submit poison jobs (refused; failing on the Borglet) and a crash-looping job"


KILL_BORGMASTER_MASTER = Fault("kill_borgmaster_master", "kill-service", "borgmaster")
KILL_SCHEDULER = Fault("kill_scheduler", "kill-service", "scheduler", 0)
KILL_AGGREGATOR = Fault("kill_aggregator", "kill-service", "aggregator", 0)
KILL_RECOMMENDER = Fault("kill_recommender", "kill-service", "recommender", 1)
KILL_AUTOPILOT_MASTER = Fault("kill_autopilot_master", "kill-service", "autopilot")
KILL_ACTUATOR = Fault("kill_actuator", "kill-service", "actuator", 0)
RESTART_POSTGRES = Fault("restart_postgres", "restart-component", "postgres")
RESTART_REDIS = Fault("restart_redis", "restart-component", "redis")
RESTART_BROKER = Fault("restart_broker", "restart-component", "kafka")
POISON_JOBS = Fault("poison_jobs", "poison-jobs")
FORGE_RECORDS = Fault("forge_records", "forge-records")


@dataclass(frozen=True)
class ChaosPlan:
    name: Literal["full", "short"]
    faults: tuple[Fault, ...]
    # After a fault: how long the system has to act again (the measure's bound), and the pause
    # before the next fault once it has (so checkpoints written every few seconds are).
    recovery_limit_s: float
    settle_s: float
    # Before the first fault, Autopilot must have acted once; after the last, the pipeline
    # gets this long to fold in what is still in flight before the stores are read.
    warm_up_limit_s: float
    drain_s: float
    # Extra environment for `cellpilot run` (e.g. a shorter hold for Autopilot jobs).
    run_env: tuple[tuple[str, str], ...] = ()


FULL = ChaosPlan(
    "full",
    (
        FORGE_RECORDS,
        KILL_BORGMASTER_MASTER,
        KILL_SCHEDULER,
        KILL_AGGREGATOR,
        KILL_RECOMMENDER,
        KILL_AUTOPILOT_MASTER,
        KILL_ACTUATOR,
        RESTART_POSTGRES,
        RESTART_REDIS,
        RESTART_BROKER,
        POISON_JOBS,
    ),
    recovery_limit_s=120.0,
    settle_s=10.0,
    warm_up_limit_s=150.0,
    drain_s=20.0,
)

# The subset the test suite runs: the poison jobs go in while the actuator is down, a held
# Autopilot job is released after 3 s instead of 30 s (the demo's jobs start at once), and
# shorter pauses.
SHORT = ChaosPlan(
    "short",
    (
        FORGE_RECORDS,
        KILL_BORGMASTER_MASTER,
        replace(KILL_ACTUATOR, name="kill_actuator_with_poison", with_poison=True),
        RESTART_BROKER,
    ),
    recovery_limit_s=45.0,
    settle_s=2.0,
    warm_up_limit_s=60.0,
    drain_s=4.0,
    run_env=(("CELLPILOT_AUTOPILOT_HOLD_GRACE_S", "3"),),
)

PLANS = {plan.name: plan for plan in (FULL, SHORT)}
