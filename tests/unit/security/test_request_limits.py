"""The generic request validator: limits name the field; fuzzed requests of every RPC never crash it."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellpilot.api.v1 import (
    autopilot_pb2,
    borglet_pb2,
    borgmaster_pb2,
    job_pb2,
    monitoring_pb2,
)
from cellpilot.security.identity import ADMIN, Principal
from cellpilot.security.policy import JobFacts, authorize
from cellpilot.security.request_limits import InvalidRequestError, RequestLimits, validate_request

SERVICES = [
    borgmaster_pb2.DESCRIPTOR.services_by_name["Borgmaster"],
    autopilot_pb2.DESCRIPTOR.services_by_name["Autopilot"],
    borglet_pb2.DESCRIPTOR.services_by_name["Borglet"],
    monitoring_pb2.DESCRIPTOR.services_by_name["Monitoring"],
]
METHODS = [(f"/{s.full_name}/{m.name}", m.input_type) for s in SERVICES for m in s.methods]


def _spec(**fields: Any) -> borgmaster_pb2.SubmitJobRequest:
    return borgmaster_pb2.SubmitJobRequest(spec=job_pb2.JobSpec(**fields))


CASES = [
    ("long-identifier", _spec(name="x" * 257), "spec.name", "257 characters"),
    ("long-text", _spec(task=job_pb2.TaskSpec(runtime=job_pb2.RuntimeSpec(
        process=job_pb2.ProcessRuntime(command="c", args=["ok", "y" * 5000]))
    )), "spec.task.runtime.process.args[1]", "at most 4096"),
    ("too-many-constraints", _spec(constraints=[job_pb2.Constraint()] * 10_001), "spec.constraints",
     "10001 items"),
    ("too-many-labels", _spec(labels={str(i): "v" for i in range(1001)}), "spec.labels", "1001 entries"),
    ("long-label-value", _spec(labels={"team": "z" * 4097}), "spec.labels['team']", "4097 characters"),
    ("undefined-enum", _spec(priority=3, app_class=7), "spec.app_class", "not a value of AppClass"),
    ("undefined-enum-in-list", borgmaster_pb2.ListJobsRequest(states=[1, 99]), "states[1]", "not a value"),
    ("nan", _spec(task=job_pb2.TaskSpec(runtime=job_pb2.RuntimeSpec(
        simulated=job_pb2.SimulatedRuntime(params={"base": math.nan}))
    )), "spec.task.runtime.simulated.params['base']", "not a finite number"),
    ("infinity", autopilot_pb2.SetAutopilotConfigRequest(config=job_pb2.AutopilotConfig(
        horizontal=job_pb2.HorizontalScalingConfig(target_utilization=math.inf))
    ), "config.horizontal.target_utilization", "not a finite number"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_message", "field", "problem"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_requests_outside_the_limits_name_the_field(
    request_message: Message, field: str, problem: str
) -> None:
    with pytest.raises(InvalidRequestError) as error:
        validate_request(request_message)
    assert error.value.field == field
    assert problem in error.value.problem


def test_requests_inside_the_limits_pass_and_overrides_and_depth_apply() -> None:
    ok = _spec(name="web", user="alice", labels={"team": "search"}, constraints=[job_pb2.Constraint()] * 5)
    validate_request(ok)
    tight = RequestLimits(overrides={"cellpilot.api.v1.JobSpec.constraints": 4})
    with pytest.raises(InvalidRequestError, match="5 items, at most 4"):
        validate_request(ok, tight)
    deep = _spec(
        task=job_pb2.TaskSpec(runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(seed=1)))
    )
    validate_request(deep, RequestLimits(max_depth=4))
    with pytest.raises(InvalidRequestError, match="nested deeper than 3"):
        validate_request(deep, RequestLimits(max_depth=3))


_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["alice", "bob", "alice/web", "bob/batch", "machine-r0-1", "task_count", "user"]),
    st.integers(200, 5000).map(lambda n: "x" * n),
)


def _scalar(data: st.DataObject, fd: FieldDescriptor) -> Any:
    if fd.type in _INT_RANGES:
        low, high = _INT_RANGES[fd.type]
        return data.draw(st.one_of(st.integers(low, high), st.integers(max(low, -3), 12)))
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return data.draw(st.booleans())
    if fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return data.draw(st.floats(width=32 if fd.type == FieldDescriptor.TYPE_FLOAT else 64))
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return data.draw(st.binary(max_size=16))
    return data.draw(_TEXT)


def _fill(data: st.DataObject, message: Message, depth: int) -> None:
    descriptor: Descriptor = message.DESCRIPTOR
    for fd in descriptor.fields:
        if not data.draw(st.booleans()):
            continue
        sub = fd.message_type if fd.type == FieldDescriptor.TYPE_MESSAGE else None
        if sub is not None and sub.GetOptions().map_entry:
            key_fd, value_fd = sub.fields_by_name["key"], sub.fields_by_name["value"]
            for _ in range(data.draw(st.integers(0, 3))):
                key = _scalar(data, key_fd)
                if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    if depth < 4:
                        _fill(data, getattr(message, fd.name)[key], depth + 1)
                else:
                    getattr(message, fd.name)[key] = _scalar(data, value_fd)
        elif fd.is_repeated:
            for _ in range(data.draw(st.integers(0, 3))):
                if sub is not None:
                    if depth < 4:
                        _fill(data, getattr(message, fd.name).add(), depth + 1)
                else:
                    getattr(message, fd.name).append(_scalar(data, fd))
        elif sub is not None:
            if depth < 4:
                getattr(message, fd.name).SetInParent()
                _fill(data, getattr(message, fd.name), depth + 1)
        else:
            setattr(message, fd.name, _scalar(data, fd))


PRINCIPALS = st.sampled_from(
    [
        Principal(user="alice"),
        Principal(user="root", capabilities=frozenset({ADMIN})),
        Principal(service="actuator"),
        Principal(service="borglet-r0", machine_globs=("machine-r0-*",)),
        Principal(service="borgmaster"),
        None,
    ]
)
JOBS = {"alice/web": JobFacts("alice", cpu_mode=job_pb2.SCALING_MODE_ON)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(METHODS), PRINCIPALS, st.data())
def test_fuzzed_requests_of_every_rpc_are_validated_and_authorised_without_crashing(
    method: tuple[str, Descriptor], principal: Principal | None, data: st.DataObject
) -> None:
    name, descriptor = method
    request = descriptor._concrete_class()
    _fill(data, request, 0)
    refused: InvalidRequestError | None = None
    try:
        validate_request(request)
    except InvalidRequestError as error:
        refused = error
    if refused is not None:  # the path starts at a real field of the request
        assert refused.field.split(".")[0].split("[")[0] in descriptor.fields_by_name
    decision = authorize(principal, name, request, JOBS.get, {"r": "alice"}.get)
    assert decision.allowed or decision.reason


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(METHODS), st.binary(max_size=200))
def test_random_wire_bytes_of_every_request_type_never_crash_the_validator(
    method: tuple[str, Descriptor], wire: bytes
) -> None:
    name, descriptor = method
    request = descriptor._concrete_class()
    try:
        request.ParseFromString(wire)
    except DecodeError:
        return  # gRPC answers INTERNAL/INVALID_ARGUMENT before a handler
    with contextlib.suppress(InvalidRequestError):
        validate_request(request)
    authorize(Principal(user="alice"), name, request, JOBS.get)
