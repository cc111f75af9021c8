"""The demo's mixed workload, as job spec YAML (the same format as ``cellpilot job submit``).

The fleet runs event time ``CELLPILOT_BORGLET_SPEEDUP`` (60) times faster than the wall clock
(see cellpilot.stack.services), so one 5-minute aggregation window closes every 5 wall seconds
and the diurnal job's 2-hour "day" passes in 2 wall minutes:

- ``web-fat``: a serving job asking for 4 cores / 4 GiB that uses 0.4 core / 300 MiB; vertical
  Autopilot on: its limits come down (Autopilot §3.2, "reduce slack").
- ``web-leak``: memory grows 256 KiB per event-second from 256 MiB under a 1 GiB hard limit; it
  OOMs, and Autopilot raises the memory limit ahead of the growth (§3.2.2, OOM handling).
- ``frontend``: a service whose load is the job's, not its tasks': a diurnal demand of 0.6-4.2
  cores in all (a 2-hour "day", 2 wall minutes) that its load balancer spreads over the tasks
  that are ready (each also idles at 50 millicores; a new task takes traffic once past its
  2-minute start-up and seen ready by the Borgmaster). Horizontal Autopilot on CPU utilisation
  (r* = 0.6 of a 1-core limit, over the last 10 minutes): tasks are added towards the peak,
  which lowers every task's load, and removed after it, once the 15-minute deferred downscaling
  has passed (§3.3).
- ``shadow``: like ``web-fat`` but dry-run: recommendations are shown, limits never change (§5).
- ``crunch``: best-effort batch (Borg §2.5), Autopilot off.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, resources_pb2, state_pb2
from cellpilot.client import SyncCellpilotClient
from cellpilot.client.job_spec_file import parse_job_spec

DEMO_USER = "demo"
DEMO_QUOTA = resources_pb2.Resources(
    cpu_millicores=200_000, memory_bytes=400 << 30, disk_bytes=1 << 44, ports=10_000
)
# The users of the job specs in examples/ (the README's first commands submit them): the demo
# cell gives them a quota too, so those commands work on the stack `make run` started.
EXAMPLE_USERS = ("alice", "bob")
EXAMPLE_QUOTA = resources_pb2.Resources(
    cpu_millicores=32_000, memory_bytes=128 << 30, disk_bytes=1 << 40, ports=1_000
)

_FAT = """
name: web-fat
user: demo
priority: 9
app_class: latency-sensitive
task_count: 3
limits: {cpu: 4, memory: 4Gi}
memory_limit: hard
runtime:
  simulated: {model: steady, params: {cpu_millicores: 400, memory_bytes: 314572800}, seed: 1,
              startup_seconds: 0}
autopilot:
  cpu: {mode: on, min: 100m, max: 8}
  memory: {mode: on, min: 128Mi, max: 8Gi}
"""

_LEAK = """
name: web-leak
user: demo
priority: 9
app_class: latency-sensitive
oom_tolerance: low
task_count: 2
limits: {cpu: 1, memory: 1Gi}
memory_limit: hard
runtime:
  simulated: {model: leak, params: {memory_start_bytes: 268435456, leak_bytes_per_second: 262144,
                                    memory_max_bytes: 3221225472}, seed: 2, startup_seconds: 0}
autopilot:
  cpu: {mode: on, min: 100m, max: 4}
  memory: {mode: on, min: 128Mi, max: 8Gi}
"""

_DIURNAL = """
name: frontend
user: demo
priority: 9
app_class: latency-sensitive
task_count: 2
limits: {cpu: 1, memory: 1Gi}
memory_limit: hard
runtime:
  simulated:
    model: steady
    params: {cpu_millicores: 50, memory_bytes: 209715200, cpu_noise: 0.1}
    seed: 3
    startup_seconds: 120
    demand:
      model: diurnal
      params: {cpu_mean_millicores: 2400, cpu_amplitude: 0.75, memory_mean_bytes: 268435456,
               memory_amplitude: 0.5, period_seconds: 7200, peak_seconds: 3600}
autopilot:
  horizontal: {mode: on, min_tasks: 2, max_tasks: 10, target_utilization: 0.6, horizon_seconds: 600,
               deferred_downscaling_seconds: 900, slow_decay_half_period_seconds: 900,
               max_initializing_fraction: 0.5}
"""

_SHADOW = """
name: shadow
user: demo
priority: 9
app_class: latency-sensitive
task_count: 2
limits: {cpu: 4, memory: 4Gi}
runtime:
  simulated: {model: steady, params: {cpu_millicores: 400, memory_bytes: 314572800}, seed: 4}
autopilot:
  cpu: {mode: dry-run}
  memory: {mode: dry-run}
"""

_BATCH = """
name: crunch
user: demo
priority: 2
app_class: batch
task_count: 6
limits: {cpu: 500m, memory: 512Mi}
memory_limit: soft
runtime:
  simulated: {model: steady, seed: 5}
"""


@dataclass(frozen=True)
class DemoJob:
    role: str  # what the user should watch it do
    spec: job_pb2.JobSpec


DEMO_JOBS: tuple[DemoJob, ...] = (
    DemoJob("over-provisioned: Autopilot shrinks its limits", parse_job_spec(_FAT)),
    DemoJob("leaking: Autopilot raises its memory limit after OOMs", parse_job_spec(_LEAK)),
    DemoJob("diurnal: Autopilot adds and removes tasks", parse_job_spec(_DIURNAL)),
    DemoJob("dry-run: recommendations only, limits never change", parse_job_spec(_SHADOW)),
    DemoJob("batch, Autopilot off", parse_job_spec(_BATCH)),
)


def grant_demo_quotas(client: SyncCellpilotClient) -> None:
    """Quota in the production and batch bands (Borg §2.5) for the demo user and the example
    users (needs an admin token)."""
    grants = [(DEMO_USER, DEMO_QUOTA), *((user, EXAMPLE_QUOTA) for user in EXAMPLE_USERS)]
    for user, limit in grants:
        for band in (job_pb2.PRIORITY_BAND_PRODUCTION, job_pb2.PRIORITY_BAND_BATCH):
            client.borgmaster.set_quota(borgmaster_pb2.SetQuotaRequest(user=user, band=band, limit=limit))


def submit_demo_workload(client: SyncCellpilotClient) -> list[tuple[DemoJob, str]]:
    """Grant the demo cell's quotas (:func:`grant_demo_quotas`) and submit every demo job not yet
    running.

    Returns (job, job id) pairs; a job of the same name already alive is reused (a second
    ``cellpilot run`` on the same data directory does not double the workload).
    """
    grant_demo_quotas(client)
    existing = {j.spec.name: j.job_id for j in _alive_jobs(client)}
    submitted = []
    for job in DEMO_JOBS:
        job_id = existing.get(job.spec.name) or client.borgmaster.submit_job(job.spec).job_id
        submitted.append((job, job_id))
    return submitted


def _alive_jobs(client: SyncCellpilotClient) -> list[state_pb2.JobStatus]:
    listing: list[state_pb2.JobStatus] = client.borgmaster.list_jobs(
        borgmaster_pb2.ListJobsRequest(user=DEMO_USER)
    )
    return [j for j in listing if j.state != state_pb2.JOB_STATE_DEAD]
