"""Who may call what: one rule per RPC of the v1 API (Borg §2.5's users and capabilities).

- Reads (Get*, List*, WhyPending, Monitoring) are open to every authenticated caller: Borg
  shows every job in a cell to its users; only changing things is restricted.
- A user mutates only their own jobs (the job id is ``<user>/<name>``, the owner the
  Borgmaster's record); quotas, machines and other users' jobs need the ``admin`` capability.
- The actuator's service identity may change only ``task_count`` and the CPU/memory limits of
  jobs whose Autopilot mode for that dimension is ON (dry-run jobs are never actuated,
  Autopilot §5), and lift the HELD_FOR_AUTOPILOT hold of jobs with some mode ON or DRY_RUN
  (Autopilot §3.1).
- A Borglet may register only the machines its certificate (or service token) names.
- The Borglet API (Poll/PollMachines/StartTask/StopTask/UpdateTask) answers only the Borgmaster;
  only Borgmaster replicas report their link shards' changes to the master.

Unknown methods are refused: a new RPC must get a rule here before it can be called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from cellpilot.api.v1 import autopilot_pb2, borgmaster_pb2, job_pb2
from cellpilot.borg.model import JobSpec as CoreJobSpec
from cellpilot.job_vocabulary import ScalingMode
from cellpilot.security.identity import Principal

BORGMASTER = "/cellpilot.api.v1.Borgmaster/"
AUTOPILOT = "/cellpilot.api.v1.Autopilot/"
BORGLET = "/cellpilot.api.v1.Borglet/"
MONITORING = "/cellpilot.api.v1.Monitoring/"
LINK_SHARDS = "/cellpilot.api.v1.LinkShards/"
SCHEDULER_LINK = "/cellpilot.api.v1.SchedulerLink/"

# Update-mask paths the actuator may write, and the Autopilot dimension each needs ON.
ACTUATOR_PATHS = {
    "task_count": "horizontal",
    "task.limits.cpu_millicores": "cpu",
    "task.limits.memory_bytes": "memory",
}


@dataclass(frozen=True)
class Decision:
    """The verdict on one call: ``code`` is None when allowed, else the status to fail with."""

    code: grpc.StatusCode | None
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.code is None


ALLOW = Decision(None)


def deny(reason: str) -> Decision:
    return Decision(grpc.StatusCode.PERMISSION_DENIED, reason)


@dataclass(frozen=True)
class JobFacts:
    """What authorisation needs to know about a stored job."""

    owner: str
    cpu_mode: int = job_pb2.SCALING_MODE_OFF
    memory_mode: int = job_pb2.SCALING_MODE_OFF
    horizontal_mode: int = job_pb2.SCALING_MODE_OFF

    @classmethod
    def from_spec(cls, spec: job_pb2.JobSpec) -> JobFacts:
        """From a v1 JobSpec (what an Autopilot master or a test holds)."""
        a = spec.autopilot
        return cls(spec.user, a.cpu.mode, a.memory.mode, a.horizontal.mode)

    @classmethod
    def from_core(cls, spec: CoreJobSpec) -> JobFacts:
        """From the Borgmaster's own record: ``JobFacts.from_core(state.job(job_id).spec)``."""
        a = spec.autopilot

        def mode(value: ScalingMode) -> int:
            return int(job_pb2.ScalingMode.Value(f"SCALING_MODE_{value.name}"))

        return cls(spec.user, mode(a.cpu.mode), mode(a.memory.mode), mode(a.horizontal.mode))

    def actuated(self, dimension: str) -> bool:
        mode = {"cpu": self.cpu_mode, "memory": self.memory_mode, "horizontal": self.horizontal_mode}
        return mode[dimension] == job_pb2.SCALING_MODE_ON

    @property
    def held_for_autopilot(self) -> bool:
        """Some dimension is ON or DRY_RUN: the Borgmaster holds such a job until Autopilot's
        first recommendation (Autopilot §3.1), and the actuator lifts the hold."""
        active = (job_pb2.SCALING_MODE_ON, job_pb2.SCALING_MODE_DRY_RUN)
        return any(m in active for m in (self.cpu_mode, self.memory_mode, self.horizontal_mode))


JobOwnerLookup = Callable[[str], JobFacts | None]
RecommenderOwnerLookup = Callable[[str], str | None]


@dataclass(frozen=True)
class Lookups:
    """How a rule learns about stored objects; absent lookups make the rules fail closed."""

    job: JobOwnerLookup | None = None
    recommender_owner: RecommenderOwnerLookup | None = None

    def job_owner(self, job_id: str) -> str:
        """The stored owner, else the ``<user>`` part of the id ("" if it has none)."""
        facts = self.job(job_id) if self.job else None
        if facts is not None:
            return facts.owner
        user, sep, name = job_id.partition("/")
        return user if sep and name else ""


Rule = Callable[[Principal, Message, Lookups], Decision]


def authenticated(principal: Principal, request: Message, lookups: Lookups) -> Decision:
    return ALLOW


def admin_only(principal: Principal, request: Message, lookups: Lookups) -> Decision:
    if principal.is_admin:
        return ALLOW
    return deny(f"{principal.describe()} lacks the admin capability this call needs")


def _owner_or_admin(principal: Principal, job_id: str, lookups: Lookups, action: str) -> Decision:
    if principal.is_admin:
        return ALLOW
    if not principal.user:
        return deny(f"{principal.describe()} may not {action} jobs")
    owner = lookups.job_owner(job_id)
    if owner and owner == principal.user:
        return ALLOW
    return deny(f"user {principal.user!r} may not {action} job {job_id!r} owned by {owner or 'nobody'!r}")


def _owned_object_rule(
    request_type: type[Message],
    id_field: str,
    action: str,
    owner_check: Callable[[Principal, str, Lookups, str], Decision],
) -> Rule:
    """A rule whose verdict is ``owner_check`` on the object named by ``request.<id_field>``."""

    def rule(principal: Principal, request: Message, lookups: Lookups) -> Decision:
        assert isinstance(request, request_type)
        return owner_check(principal, getattr(request, id_field), lookups, action)

    return rule


def _as_themself(principal: Principal, claimed_user: str, action: str, role: str) -> Decision:
    """Admins may ``action`` for anyone; users only in their own name (as ``role``), others not."""
    if principal.is_admin:
        return ALLOW
    if not principal.user:
        return deny(f"{principal.describe()} may not {action}; only users do")
    if claimed_user != principal.user:
        return deny(f"user {principal.user!r} may {action} only as {role}, not as {claimed_user!r}")
    return ALLOW


def submit_job(principal: Principal, request: Message, lookups: Lookups) -> Decision:
    assert isinstance(request, borgmaster_pb2.SubmitJobRequest)
    decision = _as_themself(principal, request.spec.user, "submit jobs", "themself")
    if not decision.allowed or principal.is_admin or not request.spec.alloc_set_job_id:
        return decision
    return _owner_or_admin(principal, request.spec.alloc_set_job_id, lookups, "run tasks in the allocs of")


def _actuator_update(
    principal: Principal, request: borgmaster_pb2.UpdateJobRequest, lookups: Lookups
) -> Decision:
    paths = list(request.update_mask.paths)
    outside = [p for p in paths if p not in ACTUATOR_PATHS]
    if outside:
        return deny(f"the actuator may change only {', '.join(ACTUATOR_PATHS)}, not {', '.join(outside)}")
    if not paths and not request.release_hold:
        return deny("the actuator's update names no field it may change")
    facts = lookups.job(request.job_id) if lookups.job else None
    if facts is None:
        return deny(f"cannot confirm Autopilot is on for job {request.job_id!r}")
    off = [p for p in paths if not facts.actuated(ACTUATOR_PATHS[p])]
    if off:
        return deny(f"Autopilot is not ON for {', '.join(off)} of job {request.job_id!r}")
    if request.release_hold and not facts.held_for_autopilot:
        return deny(f"job {request.job_id!r} is not Autopiloted; the actuator may not release its hold")
    return ALLOW


def update_job(principal: Principal, request: Message, lookups: Lookups) -> Decision:
    assert isinstance(request, borgmaster_pb2.UpdateJobRequest)
    if principal.service_kind == "actuator" and not principal.user:
        return _actuator_update(principal, request, lookups)
    decision = _owner_or_admin(principal, request.job_id, lookups, "update")
    if not decision.allowed or principal.is_admin:
        return decision
    paths = set(request.update_mask.paths)
    if "user" in paths and request.spec.user != principal.user:
        return deny("giving a job to another user needs the admin capability")
    if "alloc_set_job_id" in paths and request.spec.alloc_set_job_id:
        return _owner_or_admin(
            principal, request.spec.alloc_set_job_id, lookups, "run tasks in the allocs of"
        )
    return ALLOW


def register_machine(principal: Principal, request: Message, lookups: Lookups) -> Decision:
    assert isinstance(request, borgmaster_pb2.RegisterMachineRequest)
    if principal.is_admin:
        return ALLOW
    machine_id = request.spec.machine_id
    if principal.service_kind == "borglet" and principal.may_report_for(machine_id):
        return ALLOW
    if principal.service_kind == "borglet":
        return deny(f"Borglet {principal.service!r} may report only for its own machines, not {machine_id!r}")
    return deny(f"{principal.describe()} may not register machines; Borglets and admins do")


def register_recommender(principal: Principal, request: Message, lookups: Lookups) -> Decision:
    assert isinstance(request, autopilot_pb2.RegisterRecommenderRequest)
    return _as_themself(principal, request.owner, "register recommenders", "owner")


def _recommender_owner(principal: Principal, name: str, lookups: Lookups, action: str) -> Decision:
    if principal.is_admin:
        return ALLOW
    owner = lookups.recommender_owner(name) if lookups.recommender_owner else None
    if principal.user and owner == principal.user:
        return ALLOW
    return deny(
        f"{principal.describe()} may not {action} recommender {name!r} owned by {owner or 'nobody'!r}"
    )


def borgmaster_only(principal: Principal, request: Message, lookups: Lookups) -> Decision:
    if principal.service_kind == "borgmaster" and not principal.user:
        return ALLOW
    return deny(f"only the Borgmaster drives Borglets, not {principal.describe()}")


def scheduler_only(principal: Principal, request: Message, lookups: Lookups) -> Decision:
    if principal.service_kind == "scheduler" and not principal.user:
        return ALLOW
    return deny(f"only the cell's scheduler proposes placements, not {principal.describe()}")


RULES: Mapping[str, Rule] = {
    BORGMASTER + "SubmitJob": submit_job,
    BORGMASTER + "UpdateJob": update_job,
    BORGMASTER + "KillJob": _owned_object_rule(
        borgmaster_pb2.KillJobRequest, "job_id", "kill", _owner_or_admin
    ),
    BORGMASTER + "GetJob": authenticated,
    BORGMASTER + "ListJobs": authenticated,
    BORGMASTER + "GetTask": authenticated,
    BORGMASTER + "WhyPending": authenticated,
    BORGMASTER + "ListMachines": authenticated,
    BORGMASTER + "RegisterMachine": register_machine,
    BORGMASTER + "SetMachineState": admin_only,
    BORGMASTER + "GetQuota": authenticated,
    BORGMASTER + "SetQuota": admin_only,
    BORGMASTER + "GetLeader": authenticated,
    BORGMASTER + "GetCellStatus": authenticated,
    BORGMASTER + "TrainLifetimes": admin_only,
    BORGMASTER + "DrainMachine": admin_only,
    BORGMASTER + "GetLifetimes": authenticated,
    AUTOPILOT + "GetRecommendation": authenticated,
    AUTOPILOT + "ListRecommendations": authenticated,
    AUTOPILOT + "SetAutopilotConfig": _owned_object_rule(
        autopilot_pb2.SetAutopilotConfigRequest, "job_id", "configure Autopilot for", _owner_or_admin
    ),
    AUTOPILOT + "GetAutopilotConfig": authenticated,
    AUTOPILOT + "RegisterRecommender": register_recommender,
    AUTOPILOT + "UnregisterRecommender": _owned_object_rule(
        autopilot_pb2.UnregisterRecommenderRequest, "name", "unregister", _recommender_owner
    ),
    AUTOPILOT + "ListRecommenders": authenticated,
    AUTOPILOT + "PublishRecommendations": _owned_object_rule(
        autopilot_pb2.PublishRecommendationsRequest, "recommender_name", "publish for", _recommender_owner
    ),
    BORGLET + "Poll": borgmaster_only,
    BORGLET + "PollMachines": borgmaster_only,
    # Only Borgmaster replicas forward their link shards' reports (Borg §3.3).
    LINK_SHARDS + "ReportMachineChanges": borgmaster_only,
    LINK_SHARDS + "GetLinkShards": authenticated,
    # Only the scheduler process reads the master's soft state and proposes placements (Borg §3.4).
    SCHEDULER_LINK + "GetSoftState": scheduler_only,
    SCHEDULER_LINK + "ProposePlacements": scheduler_only,
    BORGLET + "StartTask": borgmaster_only,
    BORGLET + "StopTask": borgmaster_only,
    BORGLET + "UpdateTask": borgmaster_only,
    MONITORING + "GetHistogramHistory": authenticated,
    MONITORING + "GetTaskUsage": authenticated,
    MONITORING + "GetBucketScheme": authenticated,
}


def authorize(
    principal: Principal | None,
    method: str,
    request: Message,
    job_owner_lookup: JobOwnerLookup | None = None,
    recommender_owner_lookup: RecommenderOwnerLookup | None = None,
) -> Decision:
    """The verdict on ``principal`` calling ``method`` (e.g. ``/cellpilot.api.v1.Borgmaster/KillJob``)."""
    if principal is None:
        return Decision(grpc.StatusCode.UNAUTHENTICATED, "no authenticated caller")
    rule = RULES.get(method)
    if rule is None:
        return deny(f"no authorisation rule for {method}")
    return rule(principal, request, Lookups(job_owner_lookup, recommender_owner_lookup))
