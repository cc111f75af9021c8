"""The dashboard's JSON answers (the models behind every page, documented in the OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

ResourceName = Literal["cpu", "memory"]
JOB_PART = r"^[a-z0-9\-_.]+$"  # the job name rule of job.proto


class ServiceNote(BaseModel):
    """A service the page needed but could not reach (the page shows what it has)."""

    service: str
    detail: str


class JobSummary(BaseModel):
    job_id: str
    state: str
    priority: int
    task_count: int
    pending: int
    running: int
    cpu_limit_millicores: int
    memory_limit_bytes: int
    autopilot: str  # e.g. "cpu:on mem:dry-run", or "off"


class JobList(BaseModel):
    jobs: list[JobSummary]
    notes: list[ServiceNote] = Field(default_factory=list)


class Candidate(BaseModel):
    recommender: str
    value: int
    raw_value: int
    margin: int
    explanation: str
    selected: bool


class VerticalView(BaseModel):
    resource: ResourceName
    mode: str
    current_limit: int
    selected: str
    chosen_value: int | None
    chosen_explanation: str
    candidates: list[Candidate]


class JobDetail(BaseModel):
    job_id: str
    status: dict[str, Any]  # the Borgmaster's JobStatus (with tasks), as proto JSON
    autopilot: list[VerticalView]
    horizontal: dict[str, Any] | None
    held: bool
    notes: list[ServiceNote] = Field(default_factory=list)


class Heatmap(BaseModel):
    """How many of the job's tasks used how much of a resource in each window (Autopilot Fig. 9).

    ``tasks[b][w]`` is the number of tasks whose usage fell in bucket ``b`` during window ``w``:
    for memory each task's window peak counts once (the aggregator's memory histograms); for
    CPU the samples are scaled to tasks (``count * task_count / sample_count``)."""

    window_starts_ms: list[int]
    window_ends_ms: list[int]
    bucket_edges: list[float]  # len = buckets + 1, in the resource's unit
    tasks: list[list[float]]


class SeriesPoint(BaseModel):
    t_ms: int
    value: float


class RecommenderLine(BaseModel):
    recommender: str
    points: list[SeriesPoint]


class OomMarker(BaseModel):
    t_ms: int
    task_index: int
    memory_bytes: int


class JobUsage(BaseModel):
    job_id: str
    resource: ResourceName
    unit: str  # "millicores" or "bytes"
    heatmap: Heatmap | None
    limit: list[SeriesPoint]  # a step function: the limit from each point's time on
    recommenders: list[RecommenderLine]
    selected_recommender: str
    mode: str
    ooms: list[OomMarker]
    notes: list[ServiceNote] = Field(default_factory=list)
    # CPU: per window, the mean CPU demand per task its machines did not serve (Borg §6.2).
    unmet: list[SeriesPoint] = Field(default_factory=list)


class HorizontalDecisionView(BaseModel):
    """Autopilot's current horizontal decision (Autopilot §3.3), when it has one."""

    mode: str
    current_task_count: int
    recommended_task_count: int  # n_s[t], after stabilisation and bounds
    raw_task_count: float  # n_r[t]
    stabiliser: str  # the stabiliser that acted last
    usage_statistic: float  # r_S[t], millicores
    decided_at_ms: int  # event time of the newest input behind it
    last_actuated_ms: int


class HorizontalHistory(BaseModel):
    """The job page's horizontal chart: task count, recommendations and CPU demand over time."""

    job_id: str
    mode: str  # the job's horizontal mode: on, dry-run or off
    target_utilization: float  # r*, the target share of the CPU limit a task should use
    cpu_limit_millicores: int  # the per-task size r* is a share of: the reference size, else the limit
    task_count: list[SeriesPoint]  # a step function: the job's task count from each point on
    # n_r per recommender and window: ceil(r_S / (r* x limit)) from the CPU statistic, or the
    # raw count a target-size recommender published
    raw_recommendations: list[RecommenderLine]
    demand: list[SeriesPoint]  # the mean summed CPU usage of the job's tasks per window (millicores)
    demand_statistic: list[SeriesPoint]  # r_S the recommenders computed (millicores)
    decision: HorizontalDecisionView | None  # Autopilot's current choice n_s
    notes: list[ServiceNote] = Field(default_factory=list)


class MachineView(BaseModel):
    machine_id: str
    state: str
    rack: str
    task_count: int
    capacity: dict[str, int]
    usage: dict[str, int]
    reserved: dict[str, int]
    allocated: dict[str, int]


class CellView(BaseModel):
    machines: list[MachineView]
    totals: dict[str, dict[str, int]]  # capacity / usage / reserved / allocated -> cpu, memory
    notes: list[ServiceNote] = Field(default_factory=list)


class UsageSeries(BaseModel):
    name: str
    points: list[SeriesPoint]


class ResourceUtilisation(BaseModel):
    """One resource of the cell over time: what its jobs used per window against what it has."""

    unit: str  # "millicores" or "bytes"
    capacity: int  # of the machines up now (the Borgmaster)
    allocated: int  # the limits of the tasks on them now
    used: list[SeriesPoint]  # the cell's jobs' summed mean usage per window (the Monitoring API)
    by_job: list[UsageSeries]  # the largest users, then "other jobs"


class CellUtilisation(BaseModel):
    cpu: ResourceUtilisation
    memory: ResourceUtilisation
    jobs_counted: int
    notes: list[ServiceNote] = Field(default_factory=list)


class PendingJob(BaseModel):
    job_id: str
    state: str
    pending_tasks: int
    task_index: int
    summary: str
    machines_feasible: int
    machines_total: int
    fitting_limits: dict[str, int] | None
    lifetime_class: str = ""  # LAVA §4.3 class of its predicted lifetime ("" without a model)


class PendingView(BaseModel):
    jobs: list[PendingJob]
    notes: list[ServiceNote] = Field(default_factory=list)


class ReportEntry(BaseModel):
    name: str
    kind: Literal["markdown", "summary"]
    source: str


class ReportList(BaseModel):
    reports: list[ReportEntry]


class Report(BaseModel):
    name: str
    kind: Literal["markdown", "summary"]
    source: str
    content: Any  # markdown text, or the summary.json document
