"""Contract tests of the v1 API: the generated code matches proto/ and keeps its promises.

The services and RPCs the components rely on exist; enums start with ``*_UNSPECIFIED = 0``;
mutating RPCs carry a ``request_id``; unit-suffixed fields have the promised types; every
message survives binary and JSON round trips; and ``infra/proto/generate.py --check`` accepts
the committed code and names every kind of drift.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "proto" / "cellpilot" / "api" / "v1"
GENERATE = ROOT / "infra" / "proto" / "generate.py"
PACKAGE = "cellpilot.api.v1"

# The RPCs other components are built against.
REQUIRED_RPCS: dict[str, tuple[str, ...]] = {
    "Borgmaster": (
        "SubmitJob",
        "UpdateJob",
        "KillJob",
        "GetJob",
        "ListJobs",
        "GetTask",
        "WhyPending",
        "ListMachines",
        "RegisterMachine",
        "SetMachineState",
        "GetQuota",
        "SetQuota",
        "GetLeader",
    ),
    "Borglet": ("Poll", "StartTask", "StopTask", "UpdateTask"),
    "Autopilot": (
        "GetRecommendation",
        "ListRecommendations",
        "SetAutopilotConfig",
        "GetAutopilotConfig",
        "RegisterRecommender",
        "UnregisterRecommender",
        "ListRecommenders",
        "PublishRecommendations",
    ),
    "Monitoring": ("GetHistogramHistory", "GetTaskUsage", "GetBucketScheme"),
}

# RPCs that change nothing (reads) or converge idempotently on a versioned desired state (Poll,
# PollMachines: many machines' Polls in one call), a link shard's forwarded poll reports
# (ReportMachineChanges: machine states the master applies with its own polls' code, fenced by epoch)
# and a scheduler's proposals (ProposePlacements: each names the pending incarnation it places, so a
# retry of one the master committed is refused as no longer pending, never applied twice).
NON_MUTATING = re.compile(
    r"^(Get|List|WhyPending$|Poll$|PollMachines$|ReportMachineChanges$|ProposePlacements$)"
)

# Field-name suffix -> the scalar types a field with that unit may have.
UNIT_TYPES: dict[str, set[int]] = {
    "_ms": {FieldDescriptor.TYPE_INT64},
    "_seconds": {FieldDescriptor.TYPE_INT64},
    "_bytes": {FieldDescriptor.TYPE_INT64},
    "_millicores": {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_DOUBLE},
}


def _proto_modules() -> list[ModuleType]:
    """One ``*_pb2`` module per .proto file: a proto without generated code fails here."""
    return [
        importlib.import_module(f"{PACKAGE}.{path.stem}_pb2") for path in sorted(PROTO_DIR.glob("*.proto"))
    ]


MODULES = _proto_modules()


def _nested_messages(message: Descriptor) -> Iterator[Descriptor]:
    for nested in message.nested_types:
        if not nested.GetOptions().map_entry:
            yield nested
            yield from _nested_messages(nested)


def _all_messages() -> list[Descriptor]:
    found = []
    for module in MODULES:
        for message in module.DESCRIPTOR.message_types_by_name.values():
            found.append(message)
            found.extend(_nested_messages(message))
    return found


def _all_enums() -> list[EnumDescriptor]:
    found = [enum for module in MODULES for enum in module.DESCRIPTOR.enum_types_by_name.values()]
    found += [enum for message in _all_messages() for enum in message.enum_types]
    return found


def _all_services() -> list[ServiceDescriptor]:
    return [service for module in MODULES for service in module.DESCRIPTOR.services_by_name.values()]


def _upper_snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).upper()


MESSAGES = _all_messages()
ENUMS = _all_enums()
SERVICES = _all_services()
METHODS = [(service, method) for service in SERVICES for method in service.methods]


def test_every_proto_file_is_in_the_versioned_package() -> None:
    assert MODULES, "no .proto files found"
    wrong = {m.DESCRIPTOR.name: m.DESCRIPTOR.package for m in MODULES if m.DESCRIPTOR.package != PACKAGE}
    assert not wrong


@pytest.mark.parametrize(
    ("service_name", "rpc"),
    [(service, rpc) for service, rpcs in REQUIRED_RPCS.items() for rpc in rpcs],
    ids=[f"{service}.{rpc}" for service, rpcs in REQUIRED_RPCS.items() for rpc in rpcs],
)
def test_required_rpc_exists_with_stub_and_servicer(service_name: str, rpc: str) -> None:
    services = {service.name: service for service in SERVICES}
    assert service_name in services, f"service {service_name} missing"
    assert rpc in services[service_name].methods_by_name, f"{service_name}.{rpc} missing"

    grpc_module = importlib.import_module(f"{PACKAGE}.{service_name.lower()}_pb2_grpc")
    servicer = getattr(grpc_module, f"{service_name}Servicer")
    assert callable(getattr(servicer, rpc))
    assert callable(getattr(grpc_module, f"add_{service_name}Servicer_to_server"))
    channel = grpc.insecure_channel("localhost:9")  # never connected: stubs bind lazily
    try:
        stub = getattr(grpc_module, f"{service_name}Stub")(channel)
        assert callable(getattr(stub, rpc))
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("service", "method"), METHODS, ids=[f"{service.name}.{method.name}" for service, method in METHODS]
)
def test_rpc_messages_are_named_after_the_rpc(service: ServiceDescriptor, method: Any) -> None:
    assert method.input_type.full_name == f"{PACKAGE}.{method.name}Request"
    assert method.output_type.full_name == f"{PACKAGE}.{method.name}Response"


@pytest.mark.parametrize(
    ("service", "method"),
    [(s, m) for s, m in METHODS if not NON_MUTATING.match(m.name)],
    ids=[f"{s.name}.{m.name}" for s, m in METHODS if not NON_MUTATING.match(m.name)],
)
def test_mutating_rpc_request_carries_request_id(service: ServiceDescriptor, method: Any) -> None:
    field = method.input_type.fields_by_name.get("request_id")
    assert field is not None, f"{method.input_type.name} has no request_id"
    assert field.type == FieldDescriptor.TYPE_STRING
    assert field.number == 1


@pytest.mark.parametrize("enum", ENUMS, ids=[enum.full_name for enum in ENUMS])
def test_enum_zero_value_is_unspecified_and_values_are_prefixed(enum: EnumDescriptor) -> None:
    prefix = _upper_snake(enum.name)
    first = enum.values[0]
    assert first.number == 0
    assert first.name == f"{prefix}_UNSPECIFIED"
    unprefixed = [value.name for value in enum.values if not value.name.startswith(prefix + "_")]
    assert not unprefixed


UNIT_FIELDS = [
    (message, field, suffix)
    for message in MESSAGES
    for field in message.fields
    for suffix in UNIT_TYPES
    if field.name.endswith(suffix)
]


@pytest.mark.parametrize(
    ("message", "field", "suffix"),
    UNIT_FIELDS,
    ids=[f"{message.name}.{field.name}" for message, field, _ in UNIT_FIELDS],
)
def test_unit_suffixed_fields_have_the_unit_type(
    message: Descriptor, field: FieldDescriptor, suffix: str
) -> None:
    assert field.type in UNIT_TYPES[suffix]


def test_unit_suffixes_are_used() -> None:
    used = {suffix for _, _, suffix in UNIT_FIELDS}
    assert used == set(UNIT_TYPES)


# --- round trips ------------------------------------------------------------------------------

MAX_DEPTH = 4


def _scalar(field: FieldDescriptor, salt: int) -> Any:
    """A non-default value that would not survive truncation to a narrower type."""
    kind = field.type
    if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return -(2**40) - salt
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return 2**40 + salt
    if kind in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return -7 - salt
    if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return 7 + salt
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 0.5 + salt
    if kind == FieldDescriptor.TYPE_BOOL:
        return True
    if kind == FieldDescriptor.TYPE_STRING:
        return f"{field.name}-{salt}-é"
    if kind == FieldDescriptor.TYPE_BYTES:
        return bytes([0, 255, salt % 256])
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return field.enum_type.values[-1].number
    raise AssertionError(f"unhandled field type {kind} of {field.full_name}")


def _fields_to_set(descriptor: Descriptor, oneof_choice: dict[str, str]) -> list[FieldDescriptor]:
    """Every field, but one member per oneof: the one in ``oneof_choice``, else the first."""
    chosen = {o.full_name: oneof_choice.get(o.full_name, o.fields[0].name) for o in descriptor.oneofs}
    return [
        field
        for field in descriptor.fields
        if field.containing_oneof is None or chosen[field.containing_oneof.full_name] == field.name
    ]


def _fill(message: Message, depth: int, oneof_choice: dict[str, str]) -> None:
    for field in _fields_to_set(cast(Descriptor, message.DESCRIPTOR), oneof_choice):
        _fill_field(message, field, depth)


def _fill_field(message: Message, field: FieldDescriptor, depth: int) -> None:
    target = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_field, value_field = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        key = _scalar(key_field, field.number)
        if value_field.message_type is not None:
            _fill(target[key], depth + 1, {})
        else:
            target[key] = _scalar(value_field, field.number)
        return
    if field.message_type is not None:
        items = [target.add(), target.add()] if field.is_repeated else [target]
        for item in items:
            item.SetInParent()
            if depth < MAX_DEPTH:
                _fill(item, depth + 1, {})
        return
    if field.is_repeated:
        target.extend([_scalar(field, field.number), _scalar(field, field.number + 1)])
        return
    setattr(message, field.name, _scalar(field, field.number))


def _round_trip_cases() -> list[tuple[Descriptor, dict[str, str], str]]:
    cases: list[tuple[Descriptor, dict[str, str], str]] = []
    for message in MESSAGES:
        cases.append((message, {}, message.full_name))
        for oneof in message.oneofs:
            for field in oneof.fields[1:]:
                cases.append((message, {oneof.full_name: field.name}, f"{message.full_name}[{field.name}]"))
    return cases


ROUND_TRIP_CASES = _round_trip_cases()


def _count_set_fields(message: Message) -> int:
    total = 0
    for field, value in message.ListFields():
        total += 1
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if field.is_repeated else [value]:
                total += _count_set_fields(item)
    return total


@pytest.mark.parametrize(
    ("descriptor", "oneof_choice"),
    [(d, c) for d, c, _ in ROUND_TRIP_CASES],
    ids=[case_id for _, _, case_id in ROUND_TRIP_CASES],
)
def test_message_round_trips_through_binary_and_json(
    descriptor: Descriptor, oneof_choice: dict[str, str]
) -> None:
    cls = GetMessageClass(descriptor)
    original = cls()
    _fill(original, 0, oneof_choice)
    expected = {field.name for field in _fields_to_set(descriptor, oneof_choice)}
    assert {field.name for field, _ in original.ListFields()} == expected, "a field kept its default"

    parsed = cls.FromString(original.SerializeToString(deterministic=True))
    assert parsed == original
    assert _count_set_fields(parsed) == _count_set_fields(original)

    from_json = json_format.Parse(json_format.MessageToJson(original), cls())
    assert from_json == original


# --- generated code is current ---------------------------------------------------------------


def _run_generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATE), *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_committed_generated_code_is_current() -> None:
    result = _run_generate("--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_names_stale_missing_and_unexpected_files(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    api = tmp_path / "libs" / "cellpilot" / "api"
    shutil.copytree(ROOT / "libs" / "cellpilot" / "api", api, ignore=shutil.ignore_patterns("__pycache__"))
    assert _run_generate("--check", "--root", str(tmp_path)).returncode == 0

    (api / "v1" / "job_pb2.py").write_text((api / "v1" / "job_pb2.py").read_text() + "# hand edit\n")
    (api / "v1" / "usage_pb2.pyi").unlink()
    (api / "v1" / "notes.py").write_text("x = 1\n")
    result = _run_generate("--check", "--root", str(tmp_path))

    assert result.returncode == 1
    assert "stale:      libs/cellpilot/api/v1/job_pb2.py" in result.stderr
    assert "missing:    libs/cellpilot/api/v1/usage_pb2.pyi" in result.stderr
    assert "unexpected: libs/cellpilot/api/v1/notes.py" in result.stderr

    assert _run_generate("--root", str(tmp_path)).returncode == 0
    assert _run_generate("--check", "--root", str(tmp_path)).returncode == 0
    assert not (api / "v1" / "notes.py").exists()
