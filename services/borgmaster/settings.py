"""The Borgmaster's one settings class (environment prefix ``CELLPILOT_BORGMASTER_``).

Built once in ``__main__`` and passed down. Replica ``i`` of ``cellpilot run`` listens on
``base_port + i`` (7100, 7101, 7102 by default) unless ``port`` is set; its id is
``borgmaster-<i>``.
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.restart_backoff import RestartPolicy
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.platform.settings import MeteredReplicaSettings
from cellpilot.schedule import SchedulerConfig, default_profile
from cellpilot.schedule.cpu_demand import CpuLearning
from cellpilot.schedule.lifetime_aware.policies import placement_policy
from cellpilot.schedule.profile import PLACEMENT_POLICIES


class BorgmasterSettings(MeteredReplicaSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_BORGMASTER_", extra="ignore")
    service_name = "borgmaster"

    base_port: int = Field(default=7100, ge=1, le=65_000)
    advertise_host: str = "127.0.0.1"  # the host other processes reach this replica on
    apply_migrations: bool = True

    # Election (Borg §3.1; docs/architecture.md rule 7): a lease in PostgreSQL, renewed by the master.
    lease_s: float = Field(default=3.0, gt=0)
    renew_interval_s: float = Field(default=1.0, gt=0)
    election_interval_s: float = Field(
        default=0.5, gt=0
    )  # how often a follower tries to take an expired lease
    tail_interval_s: float = Field(default=0.2, gt=0)  # how often a follower reads new log records
    # Snapshots bound recovery: one after this many records, or this long after the last one.
    snapshot_every_records: int = Field(default=50_000, ge=1)
    snapshot_interval_s: float = Field(default=60.0, gt=0)

    # Group commit (Borg §3.1): client writes that arrive while an append is in flight share the
    # next one, at most this many per transaction (1: one transaction per request).
    commit_batch_max: int = Field(default=256, ge=1)

    # Scheduler (Borg §3.2, §3.4).
    schedule_interval_s: float = Field(default=0.25, gt=0)
    force_pass_interval_s: float = Field(default=2.0, gt=0)  # a pass even if nothing changed
    max_tasks_per_pass: int = Field(default=10_000, ge=1)
    packing: str = "hybrid"  # scorer of the last level: best-fit, worst-fit or hybrid
    # LAVA §4.2-4.3 (CELLPILOT_BORGMASTER_PLACEMENT_POLICY): best-fit (packing alone), las (LAS's
    # temporal cost above packing) or lava (LAVA's host states above LAS); las and lava use the
    # lifetime model `cellpilot cell train-lifetimes` records, and score alike until there is one.
    placement_policy: str = "best-fit"
    lifetime_interval_s: float = Field(default=5.0, gt=0)  # repredictions and LAVA deadlines (§3, §4.3)
    # GPA §4: non-prod tasks' CPU fits when P(machine CPU demand > capacity) <= gpa_rho under a
    # Gaussian of the tasks' learned moments (CELLPILOT_BORGMASTER_GPA_RHO; 0 = limits only).
    gpa_rho: float = 0.0
    gpa_window_samples: int = Field(default=100, ge=2)  # effective window of each task's moments
    gpa_min_samples: int = Field(default=20, ge=2)  # poll samples before a task's moments count
    overflow_window_samples: int = Field(default=20_000, ge=1)  # machine samples behind the rate
    scheduler_seed: int = 0
    drain_evictions_per_pass: int = Field(default=10, ge=1)

    # Borglet polls (Borg §3.3).
    poll_interval_s: float = Field(default=2.0, gt=0)
    poll_timeout_s: float = Field(default=2.0, gt=0)
    missed_polls_down: int = Field(default=5, ge=1)
    poll_concurrency: int = Field(default=256, ge=1)
    # Machines polled in one PollMachines call to a Borglet hosting many (fleet mode); 1 = one
    # Poll per machine.
    poll_batch_max: int = Field(default=250, ge=1)
    # Link shards (Borg §3.3): every replica polls its share of the machines and sends the
    # master only the reports that changed; false = the master polls every machine itself.
    link_shards: bool = True
    # A shard forwards an unchanged report after this long anyway, so the master's soft state
    # (usage) keeps being fed at a lower rate. With GPA on (gpa_rho > 0) every report is
    # forwarded: each poll's CPU sample feeds the tasks' moments (GPA §4).
    link_shard_refresh_s: float = Field(default=10.0, gt=0)
    # A standby whose shard has not reported for this long is no longer a member: the
    # machines of its share are re-partitioned over the others.
    link_shard_member_timeout_s: float = Field(default=6.0, gt=0)
    max_task_failures: int = Field(default=10, ge=0)  # error exits in a row before giving a task up

    # Restart backoff of failed tasks, in event time (Borg §4; cellpilot.borg.restart_backoff):
    # 1 s doubling to 5 min, reset after 10 min of clean running; 3 crashes on one machine
    # within 10 min keep the task off it for 30 min.
    restart_initial_delay_s: float = Field(default=1.0, ge=0)
    restart_backoff_factor: float = Field(default=2.0, ge=1)
    restart_max_delay_s: float = Field(default=300.0, ge=0)
    restart_reset_after_s: float = Field(default=600.0, ge=0)
    crash_threshold: int = Field(default=3, ge=1)
    crash_window_s: float = Field(default=600.0, ge=0)
    crash_avoid_s: float = Field(default=1800.0, ge=0)

    # Events on Kafka borg.events, in log order.
    publish_events: bool = True
    events_topic: str = "borg.events"
    recent_changes: int = Field(default=200_000, ge=1_000)  # log records whose events are kept in memory
    recent_task_events: int = Field(default=10, ge=1)  # per task, for GetTask

    @field_validator("gpa_rho")
    @classmethod
    def _overflow_probability(cls, value: float) -> float:
        if not (value == 0.0 or 0.0 < value < 0.5):
            raise ValueError(
                f"gpa_rho (CELLPILOT_BORGMASTER_GPA_RHO) is the GPA overflow probability: 0 turns "
                f"the GPA fit test off, otherwise it must be in (0, 0.5); got {value}"
            )
        return value

    @field_validator("placement_policy")
    @classmethod
    def _placement_policy(cls, value: str) -> str:
        if value not in PLACEMENT_POLICIES:
            raise ValueError(
                f"placement_policy (CELLPILOT_BORGMASTER_PLACEMENT_POLICY) must be one of "
                f"{', '.join(PLACEMENT_POLICIES)}; got {value!r}"
            )
        return value

    @property
    def keeps_lava_host_states(self) -> bool:
        """LAVA's host states are logged only under a policy that keeps them (LAS, LARS: predictions only)."""
        return placement_policy(self.placement_policy).keeps_host_states

    def scheduling_view(self, lifetimes: LifetimeTracker) -> SchedulingView:
        """A copy of the cell under this cell's scheduling policy: the master judges proposals
        and in-place updates on one, every scheduler plans on another (Borg §3.4)."""
        profile = default_profile(self.packing, self.gpa_rho, self.placement_policy, lifetimes)
        return SchedulingView(profile, SchedulerConfig(), self.scheduler_seed, self.cpu_learning)

    @property
    def cpu_learning(self) -> CpuLearning:
        return CpuLearning(self.gpa_window_samples, self.gpa_min_samples, self.overflow_window_samples)

    @property
    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy(
            initial_delay_ms=round(self.restart_initial_delay_s * 1000),
            factor=self.restart_backoff_factor,
            max_delay_ms=round(max(self.restart_max_delay_s, self.restart_initial_delay_s) * 1000),
            reset_after_ms=round(self.restart_reset_after_s * 1000),
            crash_threshold=self.crash_threshold,
            crash_window_ms=round(self.crash_window_s * 1000),
            avoid_ms=round(self.crash_avoid_s * 1000),
        )
