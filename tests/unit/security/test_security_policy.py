"""The authorisation table: every mutating RPC refuses the unauthenticated and the wrong caller.

Each case names a caller, a request and the status the policy must answer (None = allowed).
The mutating RPCs are discovered from the v1 service descriptors (a request with a
request_id, or any Borglet call), so a new mutating RPC without cases here fails the suite.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message

from cellpilot.api.v1 import (
    autopilot_pb2,
    borglet_pb2,
    borgmaster_pb2,
    job_pb2,
    lifetimes_pb2,
    link_shard_pb2,
    machine_pb2,
    monitoring_pb2,
    recommendation_pb2,
    scheduler_pb2,
)
from cellpilot.security.identity import ADMIN, Principal
from cellpilot.security.policy import RULES, JobFacts, authenticated, authorize

SERVICES = [
    borgmaster_pb2.DESCRIPTOR.services_by_name["Borgmaster"],
    autopilot_pb2.DESCRIPTOR.services_by_name["Autopilot"],
    borglet_pb2.DESCRIPTOR.services_by_name["Borglet"],
    monitoring_pb2.DESCRIPTOR.services_by_name["Monitoring"],
    link_shard_pb2.DESCRIPTOR.services_by_name["LinkShards"],
    scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerLink"],
]
ALL_METHODS = {f"/{s.full_name}/{m.name}": m for s in SERVICES for m in s.methods}
MUTATING = sorted(
    name
    for name, m in ALL_METHODS.items()
    if "request_id" in m.input_type.fields_by_name
    or ".Borglet/" in name
    or name.endswith("/ReportMachineChanges")
    or ".SchedulerLink/" in name
)

ON, OFF, DRY = job_pb2.SCALING_MODE_ON, job_pb2.SCALING_MODE_OFF, job_pb2.SCALING_MODE_DRY_RUN
JOBS = {
    "alice/web": JobFacts("alice", cpu_mode=ON, memory_mode=DRY, horizontal_mode=ON),
    "alice/allocs": JobFacts("alice"),
    "bob/batch": JobFacts("bob"),
    "bob/dry": JobFacts("bob", memory_mode=DRY),
}
RECOMMENDERS = {"alice-rec": "alice"}

ALICE = Principal(user="alice", authenticated_by="token")
BOB = Principal(user="bob", authenticated_by="token")
ROOT = Principal(user="root", capabilities=frozenset({ADMIN}), authenticated_by="token")
ACTUATOR = Principal(service="actuator", authenticated_by="mtls")
BORGLET = Principal(service="borglet-r0", machine_globs=("machine-r0-*",), authenticated_by="mtls")
BORGMASTER = Principal(service="borgmaster", authenticated_by="mtls")
SCHEDULER = Principal(service="scheduler", authenticated_by="mtls")
ALICE_VIA_DASHBOARD = Principal(user="alice", service="dashboard", authenticated_by="mtls+token")

DENIED = grpc.StatusCode.PERMISSION_DENIED
BM, AP, BL = "/cellpilot.api.v1.Borgmaster/", "/cellpilot.api.v1.Autopilot/", "/cellpilot.api.v1.Borglet/"
LS = "/cellpilot.api.v1.LinkShards/"
SL = "/cellpilot.api.v1.SchedulerLink/"


def submit(user: str, alloc_set: str = "") -> borgmaster_pb2.SubmitJobRequest:
    return borgmaster_pb2.SubmitJobRequest(
        request_id="r", spec=job_pb2.JobSpec(name="x", user=user, alloc_set_job_id=alloc_set)
    )


def update(job_id: str, *paths: str, release_hold: bool = False, user: str = "") -> Message:
    return borgmaster_pb2.UpdateJobRequest(
        request_id="r",
        job_id=job_id,
        spec=job_pb2.JobSpec(user=user),
        update_mask=FieldMask(paths=list(paths)),
        release_hold=release_hold,
    )


def register(machine_id: str) -> Message:
    return borgmaster_pb2.RegisterMachineRequest(
        request_id="r", spec=machine_pb2.MachineSpec(machine_id=machine_id)
    )


CPU, MEM, COUNT = "task.limits.cpu_millicores", "task.limits.memory_bytes", "task_count"
SET_QUOTA = borgmaster_pb2.SetQuotaRequest(request_id="r", user="alice")
DRAIN = borgmaster_pb2.SetMachineStateRequest(request_id="r", machine_id="machine-r0-1")
LARS_DRAIN = lifetimes_pb2.DrainMachineRequest(request_id="r", machine_id="machine-r0-1")
TRAIN = lifetimes_pb2.TrainLifetimesRequest(request_id="r")
PUBLISH = autopilot_pb2.PublishRecommendationsRequest(
    request_id="r", recommender_name="alice-rec", recommendations=recommendation_pb2.RecommendationSet()
)
START = borglet_pb2.StartTaskRequest(request_id="r", machine_id="machine-r0-1")

CASES: list[tuple[str, str, Message, Principal, grpc.StatusCode | None]] = [
    # SubmitJob: only as yourself; allocs must be yours; services never submit.
    ("submit-own", BM + "SubmitJob", submit("alice"), ALICE, None),
    ("submit-as-other", BM + "SubmitJob", submit("bob"), ALICE, DENIED),
    ("submit-in-others-allocs", BM + "SubmitJob", submit("bob", "alice/allocs"), BOB, DENIED),
    ("submit-in-own-allocs", BM + "SubmitJob", submit("alice", "alice/allocs"), ALICE, None),
    ("submit-admin-for-other", BM + "SubmitJob", submit("bob"), ROOT, None),
    ("submit-by-actuator", BM + "SubmitJob", submit("alice"), ACTUATOR, DENIED),
    ("submit-via-dashboard", BM + "SubmitJob", submit("alice"), ALICE_VIA_DASHBOARD, None),
    # UpdateJob: owner or admin; the actuator only limits/task counts of Autopilot-ON jobs.
    ("update-own", BM + "UpdateJob", update("alice/web", "priority"), ALICE, None),
    ("update-others", BM + "UpdateJob", update("bob/batch", "priority"), ALICE, DENIED),
    ("update-unknown-job-of-other", BM + "UpdateJob", update("bob/ghost", COUNT), ALICE, DENIED),
    ("update-give-away", BM + "UpdateJob", update("alice/web", "user", user="bob"), ALICE, DENIED),
    ("update-admin-any", BM + "UpdateJob", update("bob/batch", "priority"), ROOT, None),
    ("actuator-cpu-on", BM + "UpdateJob", update("alice/web", CPU), ACTUATOR, None),
    ("actuator-count-on", BM + "UpdateJob", update("alice/web", COUNT), ACTUATOR, None),
    ("actuator-memory-dry-run", BM + "UpdateJob", update("alice/web", MEM), ACTUATOR, DENIED),
    ("actuator-not-autopiloted", BM + "UpdateJob", update("bob/batch", CPU), ACTUATOR, DENIED),
    ("actuator-priority", BM + "UpdateJob", update("alice/web", "priority"), ACTUATOR, DENIED),
    ("actuator-unknown-job", BM + "UpdateJob", update("alice/ghost", CPU), ACTUATOR, DENIED),
    ("actuator-release-hold", BM + "UpdateJob", update("alice/web", release_hold=True), ACTUATOR, None),
    ("actuator-release-dry-run", BM + "UpdateJob", update("bob/dry", release_hold=True), ACTUATOR, None),
    ("actuator-dry-run-memory", BM + "UpdateJob", update("bob/dry", MEM), ACTUATOR, DENIED),
    ("actuator-release-off", BM + "UpdateJob", update("bob/batch", release_hold=True), ACTUATOR, DENIED),
    ("borglet-updates-job", BM + "UpdateJob", update("alice/web", CPU), BORGLET, DENIED),
    # KillJob: owner or admin.
    ("kill-own", BM + "KillJob", borgmaster_pb2.KillJobRequest(job_id="alice/web"), ALICE, None),
    ("kill-others", BM + "KillJob", borgmaster_pb2.KillJobRequest(job_id="alice/web"), BOB, DENIED),
    ("kill-admin", BM + "KillJob", borgmaster_pb2.KillJobRequest(job_id="alice/web"), ROOT, None),
    ("kill-actuator", BM + "KillJob", borgmaster_pb2.KillJobRequest(job_id="alice/web"), ACTUATOR, DENIED),
    ("kill-bad-id", BM + "KillJob", borgmaster_pb2.KillJobRequest(job_id="noslash"), ALICE, DENIED),
    # Machines: a Borglet registers only its own; draining is an admin's.
    ("register-own-machine", BM + "RegisterMachine", register("machine-r0-3"), BORGLET, None),
    ("register-other-machine", BM + "RegisterMachine", register("machine-r1-3"), BORGLET, DENIED),
    ("register-by-user", BM + "RegisterMachine", register("machine-r0-3"), ALICE, DENIED),
    ("register-by-admin", BM + "RegisterMachine", register("machine-r1-3"), ROOT, None),
    ("drain-by-user", BM + "SetMachineState", DRAIN, ALICE, DENIED),
    ("drain-by-borglet", BM + "SetMachineState", DRAIN, BORGLET, DENIED),
    ("drain-by-admin", BM + "SetMachineState", DRAIN, ROOT, None),
    ("lars-drain-by-user", BM + "DrainMachine", LARS_DRAIN, ALICE, DENIED),
    ("lars-drain-by-borglet", BM + "DrainMachine", LARS_DRAIN, BORGLET, DENIED),
    ("lars-drain-by-admin", BM + "DrainMachine", LARS_DRAIN, ROOT, None),
    # The cell's lifetime model (LAVA §3): trained for everyone, so by the administrator only.
    ("train-lifetimes-by-user", BM + "TrainLifetimes", TRAIN, ALICE, DENIED),
    ("train-lifetimes-by-admin", BM + "TrainLifetimes", TRAIN, ROOT, None),
    # Quotas: admin only, even one's own.
    ("quota-own-by-user", BM + "SetQuota", SET_QUOTA, ALICE, DENIED),
    ("quota-by-actuator", BM + "SetQuota", SET_QUOTA, ACTUATOR, DENIED),
    ("quota-by-admin", BM + "SetQuota", SET_QUOTA, ROOT, None),
    # Autopilot configuration and custom recommenders.
    ("ap-config-own", AP + "SetAutopilotConfig",
     autopilot_pb2.SetAutopilotConfigRequest(job_id="alice/web"), ALICE, None),
    ("ap-config-others", AP + "SetAutopilotConfig",
     autopilot_pb2.SetAutopilotConfigRequest(job_id="alice/web"), BOB, DENIED),
    ("ap-config-actuator", AP + "SetAutopilotConfig",
     autopilot_pb2.SetAutopilotConfigRequest(job_id="alice/web"), ACTUATOR, DENIED),
    ("rec-register-own", AP + "RegisterRecommender",
     autopilot_pb2.RegisterRecommenderRequest(name="r", owner="alice"), ALICE, None),
    ("rec-register-as-other", AP + "RegisterRecommender",
     autopilot_pb2.RegisterRecommenderRequest(name="r", owner="bob"), ALICE, DENIED),
    ("rec-register-service", AP + "RegisterRecommender",
     autopilot_pb2.RegisterRecommenderRequest(name="r", owner=""), BORGMASTER, DENIED),
    ("rec-unregister-own", AP + "UnregisterRecommender",
     autopilot_pb2.UnregisterRecommenderRequest(name="alice-rec"), ALICE, None),
    ("rec-unregister-others", AP + "UnregisterRecommender",
     autopilot_pb2.UnregisterRecommenderRequest(name="alice-rec"), BOB, DENIED),
    ("rec-unregister-unknown", AP + "UnregisterRecommender",
     autopilot_pb2.UnregisterRecommenderRequest(name="ghost"), BOB, DENIED),
    ("rec-publish-own", AP + "PublishRecommendations", PUBLISH, ALICE, None),
    ("rec-publish-others", AP + "PublishRecommendations", PUBLISH, BOB, DENIED),
    ("rec-publish-admin", AP + "PublishRecommendations", PUBLISH, ROOT, None),
    # The Borglet API answers only the Borgmaster.
    ("borglet-start-by-master", BL + "StartTask", START, BORGMASTER, None),
    ("borglet-start-by-user", BL + "StartTask", START, ALICE, DENIED),
    ("borglet-start-by-admin", BL + "StartTask", START, ROOT, DENIED),
    ("borglet-stop-by-master", BL + "StopTask", borglet_pb2.StopTaskRequest(), BORGMASTER, None),
    ("borglet-update-by-master", BL + "UpdateTask", borglet_pb2.UpdateTaskRequest(), BORGMASTER, None),
    ("borglet-stop-by-actuator", BL + "StopTask", borglet_pb2.StopTaskRequest(), ACTUATOR, DENIED),
    ("borglet-update-by-borglet", BL + "UpdateTask", borglet_pb2.UpdateTaskRequest(), BORGLET, DENIED),
    ("borglet-poll-by-master", BL + "Poll", borglet_pb2.PollRequest(), BORGMASTER, None),
    ("borglet-poll-by-user", BL + "Poll", borglet_pb2.PollRequest(), ALICE, DENIED),
    ("borglet-poll-many-by-master", BL + "PollMachines", borglet_pb2.PollMachinesRequest(), BORGMASTER, None),
    ("borglet-poll-many-by-borglet", BL + "PollMachines", borglet_pb2.PollMachinesRequest(), BORGLET, DENIED),
    # Only Borgmaster replicas forward link-shard reports (Borg §3.3).
    ("shard-report-by-replica", LS + "ReportMachineChanges",
     link_shard_pb2.ReportMachineChangesRequest(), BORGMASTER, None),
    ("shard-report-by-borglet", LS + "ReportMachineChanges",
     link_shard_pb2.ReportMachineChangesRequest(), BORGLET, DENIED),
    ("shard-report-by-admin", LS + "ReportMachineChanges",
     link_shard_pb2.ReportMachineChangesRequest(), ROOT, DENIED),
    # Only the cell's scheduler proposes placements and reads the master's soft state (Borg §3.4).
    ("proposal-by-scheduler", SL + "ProposePlacements",
     scheduler_pb2.ProposePlacementsRequest(), SCHEDULER, None),
    ("proposal-by-replica", SL + "ProposePlacements",
     scheduler_pb2.ProposePlacementsRequest(), BORGMASTER, DENIED),
    ("proposal-by-admin", SL + "ProposePlacements",
     scheduler_pb2.ProposePlacementsRequest(), ROOT, DENIED),
    ("soft-state-by-scheduler", SL + "GetSoftState", scheduler_pb2.GetSoftStateRequest(), SCHEDULER, None),
    ("soft-state-by-user", SL + "GetSoftState", scheduler_pb2.GetSoftStateRequest(), ALICE, DENIED),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "request_message", "principal", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_policy_answers_each_caller(
    method: str, request_message: Message, principal: Principal, expected: grpc.StatusCode | None
) -> None:
    decision = authorize(principal, method, request_message, JOBS.get, RECOMMENDERS.get)
    assert decision.code == expected, decision.reason
    if expected is not None:
        assert decision.reason  # a refusal always says why


@pytest.mark.parametrize("method", MUTATING)
def test_every_mutating_rpc_refuses_unauthenticated_callers(method: str) -> None:
    request = ALL_METHODS[method].input_type._concrete_class()
    decision = authorize(None, method, request, JOBS.get, RECOMMENDERS.get)
    assert decision.code == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("method", MUTATING)
def test_every_mutating_rpc_refuses_some_wrong_caller_and_allows_a_right_one(method: str) -> None:
    outcomes = {code for _, m, _, _, code in CASES if m == method}
    assert DENIED in outcomes, f"no PERMISSION_DENIED case for {method}"
    assert None in outcomes, f"no allowed case for {method}"
    assert RULES[method] is not authenticated


@pytest.mark.parametrize("method", MUTATING)
def test_an_empty_request_from_a_plain_user_never_passes_a_mutating_rule(method: str) -> None:
    request = ALL_METHODS[method].input_type._concrete_class()
    stranger = Principal(user="mallory", authenticated_by="token")
    assert authorize(stranger, method, request, JOBS.get, RECOMMENDERS.get).code == DENIED


def test_every_rpc_of_the_api_has_a_rule_and_unknown_ones_are_refused() -> None:
    assert set(ALL_METHODS) == set(RULES)
    decision = authorize(ALICE, "/cellpilot.api.v1.Borgmaster/DropAllJobs", submit("alice"))
    assert decision.code == DENIED
    assert "no authorisation rule" in decision.reason


def test_reads_are_open_to_every_authenticated_caller() -> None:
    reads = [m for m in ALL_METHODS if m not in MUTATING]
    assert BM + "GetJob" in reads
    for method in reads:
        request = ALL_METHODS[method].input_type._concrete_class()
        assert authorize(BOB, method, request).allowed
        assert authorize(None, method, request).code == grpc.StatusCode.UNAUTHENTICATED


def test_without_a_job_lookup_the_actuator_is_refused_and_owners_come_from_the_job_id() -> None:
    assert authorize(ACTUATOR, BM + "UpdateJob", update("alice/web", CPU)).code == DENIED
    assert authorize(ALICE, BM + "KillJob", borgmaster_pb2.KillJobRequest(job_id="alice/x")).allowed
    assert not authorize(BOB, BM + "KillJob", borgmaster_pb2.KillJobRequest(job_id="alice/x")).allowed


def test_job_facts_from_a_spec_read_the_autopilot_modes() -> None:
    spec = job_pb2.JobSpec(user="alice")
    spec.autopilot.cpu.mode = ON
    spec.autopilot.horizontal.mode = DRY
    facts = JobFacts.from_spec(spec)
    assert facts.owner == "alice"
    assert facts.actuated("cpu")
    assert not facts.actuated("horizontal")
    assert not facts.actuated("memory")


def test_job_facts_from_the_borgmaster_core_record_match_the_proto_ones() -> None:
    from cellpilot.borg.model import AutopilotConfig, JobSpec, TaskSpec, VerticalScaling
    from cellpilot.job_vocabulary import ScalingMode
    from cellpilot.schedule import Resources

    core = JobSpec(
        name="web",
        user="alice",
        priority=2,
        task=TaskSpec(Resources(1000, 1 << 30)),
        autopilot=AutopilotConfig(cpu=VerticalScaling(mode=ScalingMode.ON)),
    )
    facts = JobFacts.from_core(core)
    assert facts == JobFacts("alice", cpu_mode=ON, memory_mode=job_pb2.SCALING_MODE_UNSPECIFIED,
                             horizontal_mode=job_pb2.SCALING_MODE_UNSPECIFIED)  # fmt: skip
    assert facts.actuated("cpu")
    assert facts.held_for_autopilot
