"""A real grpc.aio server (GrpcServer + the security interceptor) over mTLS and bearer tokens.

The servicer is a tiny in-memory Borgmaster that records who called it (through the
principal contextvar); the real services adopt the same interceptor with one line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, job_pb2
from cellpilot.client import CellpilotClient, PermissionDeniedError, RetryPolicy, UnauthenticatedError
from cellpilot.platform.grpc_server import GrpcServer, ServiceBinding
from cellpilot.security.certificates import IdentityRequest, issue_all
from cellpilot.security.identity import ADMIN, require_principal
from cellpilot.security.policy import JobFacts
from cellpilot.security.tls import SecurityConfigError, SecuritySettings
from cellpilot.security.tokens import create_secret, load_signer

FAST = RetryPolicy(budget_s=2.0, initial_backoff_s=0.05, max_backoff_s=0.1, call_timeout_s=2.0)


class TinyBorgmaster(borgmaster_pb2_grpc.BorgmasterServicer):
    def __init__(self) -> None:
        self.jobs: dict[str, job_pb2.JobSpec] = {}
        self.callers: list[str] = []

    def facts(self, job_id: str) -> JobFacts | None:
        spec = self.jobs.get(job_id)
        return JobFacts.from_spec(spec) if spec is not None else None

    async def SubmitJob(self, request, context):  # type: ignore[no-untyped-def]
        self.callers.append(require_principal().describe())
        job_id = f"{request.spec.user}/{request.spec.name}"
        self.jobs[job_id] = request.spec
        return borgmaster_pb2.SubmitJobResponse(job_id=job_id)

    async def UpdateJob(self, request, context):  # type: ignore[no-untyped-def]
        self.callers.append(require_principal().describe())
        spec = self.jobs[request.job_id]
        if "task.limits.cpu_millicores" in request.update_mask.paths:
            spec.task.limits.cpu_millicores = request.spec.task.limits.cpu_millicores
        return borgmaster_pb2.UpdateJobResponse()

    async def KillJob(self, request, context):  # type: ignore[no-untyped-def]
        self.callers.append(require_principal().describe())
        self.jobs.pop(request.job_id, None)
        return borgmaster_pb2.KillJobResponse()


def spec(user: str, name: str = "web", autopilot_cpu: bool = False) -> job_pb2.JobSpec:
    result = job_pb2.JobSpec(name=name, user=user, priority=2, task_count=1)
    if autopilot_cpu:
        result.autopilot.cpu.mode = job_pb2.SCALING_MODE_ON
    return result


@pytest.fixture(scope="module")
def certs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("certs")
    issue_all(path, [IdentityRequest(n) for n in ("borgmaster", "actuator", "client")], valid_days=1)
    create_secret(path)
    return path


def tokens(certs_dir: Path) -> dict[str, str]:
    signer = load_signer(certs_dir)
    return {
        "alice": signer.issue_for("alice"),
        "bob": signer.issue_for("bob"),
        "root": signer.issue_for("root", capabilities=[ADMIN]),
    }


async def serve(security: SecuritySettings) -> tuple[GrpcServer, TinyBorgmaster, str]:
    servicer = TinyBorgmaster()
    binding = ServiceBinding(
        "cellpilot.api.v1.Borgmaster", borgmaster_pb2_grpc.add_BorgmasterServicer_to_server, servicer
    )
    server = GrpcServer(
        [binding], "127.0.0.1:0", **security.server_options("borgmaster", job_owner_lookup=servicer.facts)
    )
    port = await server.start()
    return server, servicer, f"127.0.0.1:{port}"


@pytest.fixture
async def mtls(certs_dir: Path) -> AsyncIterator[tuple[SecuritySettings, TinyBorgmaster, str]]:
    security = SecuritySettings(tls_mode="mtls", certs_dir=certs_dir, max_request_bytes=64 * 1024)
    server, servicer, address = await serve(security)
    yield security, servicer, address
    await server.stop(0.1)


async def test_users_act_on_their_own_jobs_only_and_servicers_see_the_caller(mtls, certs_dir: Path) -> None:  # type: ignore[no-untyped-def]
    security, servicer, address = mtls
    t = tokens(certs_dir)
    client_credentials = security.channel_credentials()  # the "client" certificate of user programs
    async with CellpilotClient(
        borgmaster=[address], credentials=client_credentials, token=t["alice"], policy=FAST
    ) as alice:
        submitted = await alice.borgmaster.submit_job(spec("alice"))
        assert submitted.job_id == "alice/web"
        with pytest.raises(PermissionDeniedError, match="only as themself"):
            await alice.borgmaster.submit_job(spec("bob"))
    async with CellpilotClient(
        borgmaster=[address], credentials=client_credentials, token=t["bob"], policy=FAST
    ) as bob:
        with pytest.raises(PermissionDeniedError, match="may not kill job 'alice/web'"):
            await bob.borgmaster.kill_job("alice/web")
    assert "alice/web" in servicer.jobs  # the refused kill never reached the servicer
    async with CellpilotClient(
        borgmaster=[address], credentials=client_credentials, token=t["root"], policy=FAST
    ) as root:
        await root.borgmaster.kill_job("alice/web")
    assert "alice/web" not in servicer.jobs
    assert servicer.callers == ["user 'alice'", "user 'root'"]


async def test_missing_or_forged_credentials_are_unauthenticated(mtls, certs_dir: Path) -> None:  # type: ignore[no-untyped-def]
    security, servicer, address = mtls
    credentials = security.channel_credentials()
    for token in (None, "cpt1.e30.forged"):
        async with CellpilotClient(
            borgmaster=[address], credentials=credentials, token=token, policy=FAST
        ) as anon:
            with pytest.raises(UnauthenticatedError):
                await anon.borgmaster.submit_job(spec("alice"))
    # Without a client certificate the TLS handshake itself fails.
    no_cert = grpc.ssl_channel_credentials(root_certificates=(certs_dir / "ca.crt").read_bytes())
    async with grpc.aio.secure_channel(address, no_cert) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await borgmaster_pb2_grpc.BorgmasterStub(channel).SubmitJob(
                borgmaster_pb2.SubmitJobRequest(spec=spec("alice")), timeout=2
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.jobs == {}


async def test_the_actuator_changes_only_limits_of_autopiloted_jobs(mtls, certs_dir: Path) -> None:  # type: ignore[no-untyped-def]
    security, servicer, address = mtls
    servicer.jobs["alice/web"] = spec("alice", autopilot_cpu=True)
    servicer.jobs["bob/batch"] = spec("bob", "batch")

    def update(job_id: str, path: str) -> borgmaster_pb2.UpdateJobRequest:
        new = job_pb2.JobSpec(priority=9)
        new.task.limits.cpu_millicores = 750
        return borgmaster_pb2.UpdateJobRequest(job_id=job_id, spec=new, update_mask=FieldMask(paths=[path]))

    async with grpc.aio.secure_channel(address, security.channel_credentials("actuator")) as channel:
        stub = borgmaster_pb2_grpc.BorgmasterStub(channel)
        await stub.UpdateJob(update("alice/web", "task.limits.cpu_millicores"), timeout=2)
        assert servicer.jobs["alice/web"].task.limits.cpu_millicores == 750
        for job_id, path in (("alice/web", "priority"), ("bob/batch", "task.limits.cpu_millicores")):
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await stub.UpdateJob(update(job_id, path), timeout=2)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert servicer.callers == ["service 'actuator'"]
    assert servicer.jobs["bob/batch"].task.limits.cpu_millicores == 0


async def test_bad_and_oversized_requests_are_refused_before_the_servicer(mtls, certs_dir: Path) -> None:  # type: ignore[no-untyped-def]
    security, servicer, address = mtls
    metadata = (("authorization", f"Bearer {tokens(certs_dir)['alice']}"),)
    async with grpc.aio.secure_channel(address, security.channel_credentials()) as channel:
        stub = borgmaster_pb2_grpc.BorgmasterStub(channel)
        too_long = spec("alice", name="x" * 300)
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await stub.SubmitJob(borgmaster_pb2.SubmitJobRequest(spec=too_long), metadata=metadata, timeout=2)
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.name" in (invalid.value.details() or "")
        huge = spec("alice")
        huge.labels["blob"] = "y" * 100_000  # over the 64 KiB request limit configured above
        with pytest.raises(grpc.aio.AioRpcError) as oversized:
            await stub.SubmitJob(borgmaster_pb2.SubmitJobRequest(spec=huge), metadata=metadata, timeout=2)
        assert oversized.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Health checks need the certificate but no token.
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert servicer.jobs == {}


async def test_plaintext_only_when_asked_and_identities_still_come_from_tokens(
    certs_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(SecurityConfigError, match="cellpilot certs issue"):
        SecuritySettings(tls_mode="mtls", certs_dir=tmp_path).server_credentials("borgmaster")
    security = SecuritySettings(tls_mode="plaintext-dev", certs_dir=certs_dir)
    server, servicer, address = await serve(security)
    try:
        servicer.jobs["alice/web"] = spec("alice", autopilot_cpu=True)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = borgmaster_pb2_grpc.BorgmasterStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as anonymous:
                await stub.KillJob(borgmaster_pb2.KillJobRequest(job_id="alice/web"), timeout=2)
            assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
            new = job_pb2.JobSpec()
            new.task.limits.cpu_millicores = 900
            request = borgmaster_pb2.UpdateJobRequest(
                job_id="alice/web", spec=new, update_mask=FieldMask(paths=["task.limits.cpu_millicores"])
            )
            await stub.UpdateJob(request, metadata=security.service_metadata("actuator"), timeout=2)
        async with CellpilotClient(
            borgmaster=[address], policy=FAST, **security.client_options("actuator")
        ) as actuator:
            with pytest.raises(PermissionDeniedError):
                await actuator.borgmaster.kill_job("alice/web")
        assert servicer.jobs["alice/web"].task.limits.cpu_millicores == 900
        assert servicer.callers == ["service 'actuator'"]
    finally:
        await server.stop(0.1)
