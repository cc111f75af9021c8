"""The API commands' option parsing and messages: bounds, modes, recommenders, gRPC errors."""

from __future__ import annotations

import grpc
import pytest
import typer

from cellpilot.api.v1 import job_pb2
from cellpilot.cli.autopilot_cmd import apply_options
from cellpilot.cli.job import job_id, quantity
from cellpilot.cli.output import addresses, describe_error
from cellpilot.client.errors import error_from_status
from cellpilot.platform.error_reasons import QUOTA_EXCEEDED, STORE_UNAVAILABLE

GIB = 1 << 30


def test_opt_in_sets_both_resources_and_keeps_the_rest() -> None:
    start = job_pb2.AutopilotConfig(horizontal=job_pb2.HorizontalScalingConfig(max_tasks=7))
    config = apply_options(start, ["cpu", "memory"], job_pb2.SCALING_MODE_ON, [], [], None)
    assert (config.cpu.mode, config.memory.mode) == (job_pb2.SCALING_MODE_ON, job_pb2.SCALING_MODE_ON)
    assert config.horizontal.max_tasks == 7
    assert config.horizontal.mode == job_pb2.SCALING_MODE_UNSPECIFIED
    assert start.cpu.mode == job_pb2.SCALING_MODE_UNSPECIFIED  # the input is not changed


def test_bounds_and_recommenders_parse_with_units() -> None:
    config = apply_options(
        job_pb2.AutopilotConfig(),
        ["memory"],
        job_pb2.SCALING_MODE_DRY_RUN,
        ["cpu=100m:4", "memory=256Mi:", "tasks=1:20"],
        ["cpu=ml", "memory=custom:mine"],
        0.7,
    )
    assert (config.cpu.min_limit, config.cpu.max_limit) == (100, 4000)
    assert (config.memory.min_limit, config.memory.max_limit) == (256 << 20, 0)
    assert (config.horizontal.min_tasks, config.horizontal.max_tasks) == (1, 20)
    assert config.memory.mode == job_pb2.SCALING_MODE_DRY_RUN
    assert config.cpu.mode == 0
    assert config.cpu.recommender.kind == job_pb2.RECOMMENDER_KIND_ML
    assert (config.memory.recommender.kind, config.memory.recommender.custom_name) == (
        job_pb2.RECOMMENDER_KIND_CUSTOM,
        "mine",
    )
    assert config.horizontal.target_utilization == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("bounds", "recommenders", "resources", "message"),
    [
        (["disk=1:2"], [], ["cpu"], "RESOURCE one of"),
        (["cpu=4"], [], ["cpu"], "expected MIN:MAX"),
        (["cpu=4:1"], [], ["cpu"], "minimum is above the maximum"),
        (["memory=lots:"], [], ["cpu"], "expected bytes"),
        (["tasks=a:3"], [], ["cpu"], "whole numbers"),
        ([], ["cpu=magic"], ["cpu"], "'magic'; one of"),
        ([], ["tasks=ml"], ["cpu"], "no recommender choice"),
        ([], [], ["gpu"], "'gpu'; one of"),
    ],
    ids=[
        "unknown-resource",
        "no-colon",
        "inverted",
        "bad-size",
        "bad-count",
        "bad-recommender",
        "tasks-recommender",
        "bad-resource",
    ],
)
def test_bad_options_name_the_problem(
    bounds: list[str], recommenders: list[str], resources: list[str], message: str
) -> None:
    with pytest.raises(typer.BadParameter, match=message):
        apply_options(job_pb2.AutopilotConfig(), resources, None, bounds, recommenders, None)


def test_quantities_jobs_and_addresses() -> None:
    assert quantity("--cpu", "1.5", "cpu") == 1500
    assert quantity("--memory", "2Gi", "memory") == 2 * GIB
    with pytest.raises(typer.BadParameter, match="millicores"):
        quantity("--cpu", "fast", "cpu")
    assert job_id("alice/web") == "alice/web"
    for bad in ("web", "alice/", "a/b/c"):
        with pytest.raises(typer.BadParameter, match="<user>/<name>"):
            job_id(bad)
    assert addresses("a:1, b:2") == ["a:1", "b:2"]
    with pytest.raises(typer.BadParameter, match="host:port"):
        addresses("nohost")


ERRORS = {
    "unreachable": (grpc.StatusCode.UNAVAILABLE, "", "cannot reach the service (SubmitJob)"),
    "store-down": (grpc.StatusCode.UNAVAILABLE, STORE_UNAVAILABLE, "unavailable for now (SubmitJob)"),
    "invalid": (grpc.StatusCode.INVALID_ARGUMENT, "", "refused as invalid (SubmitJob): spec.name"),
    "quota": (grpc.StatusCode.RESOURCE_EXHAUSTED, QUOTA_EXCEEDED, "over quota (SubmitJob)"),
    "too-large": (grpc.StatusCode.RESOURCE_EXHAUSTED, "", "request too large (SubmitJob)"),
    "not-found": (grpc.StatusCode.NOT_FOUND, "", "not found (SubmitJob)"),
    "conflict": (grpc.StatusCode.FAILED_PRECONDITION, "", "conflict (SubmitJob)"),
    "internal": (grpc.StatusCode.INTERNAL, "", "internal (SubmitJob)"),
}


@pytest.mark.parametrize(("code", "reason", "expected"), ERRORS.values(), ids=ERRORS.keys())
def test_grpc_errors_become_one_clear_line(code: grpc.StatusCode, reason: str, expected: str) -> None:
    line = describe_error(error_from_status(code, "spec.name: is required", "SubmitJob", reason))
    assert expected in line
    assert "\n" not in line
