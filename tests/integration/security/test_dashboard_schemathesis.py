"""Schemathesis against the dashboard's OpenAPI, served over HTTPS by a real dashboard process.

The dashboard reads a real Borgmaster and Borglet fleet (one job) over mTLS. Every operation
in its schema is exercised with generated parameters: with a bearer token the service never
answers 5xx and its JSON matches the schema; without one every operation but /healthz is 401.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

from cell_processes import Process, grant_quota, running_cell, wait_for_machines
from stack_security import bearer_header, client_options, https_context, security

from cellpilot.api.v1 import job_pb2, resources_pb2
from cellpilot.client import SyncCellpilotClient
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

pytestmark = pytest.mark.timeout(150)
USER = f"st{uuid.uuid4().hex[:6]}"
OPEN_PATHS = {"/healthz"}  # liveness probes carry no token


@pytest.fixture(scope="module")
def dashboard_url(endpoints: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from sqlalchemy import make_url

    from cellpilot.platform.postgres import apply_migrations, drop_database, ensure_database

    database_url = str(make_url(endpoints.postgres_url).set(database=f"st_{uuid.uuid4().hex[:10]}"))
    asyncio.run(ensure_database(database_url))
    asyncio.run(apply_migrations(database_url))
    log_dir = tmp_path_factory.mktemp("schemathesis")
    port, nobody = free_port(), free_port()
    try:
        with running_cell(endpoints, database_url, log_dir, machines=1) as borgmaster:
            web = Process(
                "dashboard",
                {
                    "CELLPILOT_DASHBOARD_PORT": str(port),
                    "CELLPILOT_DASHBOARD_BORGMASTER_ADDRESSES": borgmaster,
                    "CELLPILOT_DASHBOARD_MONITORING_ADDRESSES": f"127.0.0.1:{nobody}",
                    "CELLPILOT_DASHBOARD_AUTOPILOT_ADDRESSES": f"127.0.0.1:{nobody}",
                    "CELLPILOT_DASHBOARD_CALL_BUDGET_S": "0.5",
                    "CELLPILOT_DASHBOARD_FOLLOW_STREAMS": "false",
                    "CELLPILOT_DASHBOARD_RESULTS_DIR": str(log_dir),
                },
                log_dir,
                endpoints,
            )
            try:
                wait_for_machines(borgmaster, 1)
                grant_quota(borgmaster, USER)
                spec = job_pb2.JobSpec(
                    name="web",
                    user=USER,
                    priority=9,
                    app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
                    task_count=1,
                    task=job_pb2.TaskSpec(
                        limits=resources_pb2.Resources(cpu_millicores=500, memory_bytes=1 << 30),
                        runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="steady")),
                    ),
                )
                with SyncCellpilotClient([borgmaster], **client_options(USER)) as client:
                    client.borgmaster.submit_job(spec)
                base = f"https://127.0.0.1:{port}"
                deadline = time.monotonic() + 30
                while True:
                    try:
                        urllib.request.urlopen(f"{base}/healthz", timeout=2, context=https_context()).close()
                        break
                    except OSError:
                        assert time.monotonic() < deadline, web.log_tail()
                        time.sleep(0.3)
                yield base
            finally:
                web.stop()
    finally:
        asyncio.run(drop_database(database_url))


@pytest.fixture(scope="module")
def session() -> requests.Session:
    http = requests.Session()
    http.trust_env = False  # REQUESTS_CA_BUNDLE would replace the stack's CA
    http.verify = str(security().certs_dir / "ca.crt")
    return http


@pytest.fixture(scope="module")
def dashboard_schema(dashboard_url: str, session: requests.Session) -> schemathesis.BaseSchema:
    raw = session.get(f"{dashboard_url}/openapi.json", timeout=10).json()
    assert raw["paths"], "the dashboard publishes its API"
    return schemathesis.openapi.from_dict(raw)


def test_the_dashboard_api_conforms_and_never_fails(
    dashboard_schema: schemathesis.BaseSchema, dashboard_url: str, session: requests.Session
) -> None:
    operations = [result.ok() for result in dashboard_schema.get_all_operations()]
    assert len(operations) >= 7
    headers = bearer_header(USER, admin=False)
    for operation in operations:

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(case=operation.as_strategy())
        def conforms(case: schemathesis.Case) -> None:
            case.call_and_validate(
                base_url=dashboard_url,
                session=session,
                headers=headers,
                checks=[not_a_server_error, response_schema_conformance],
                verify=session.verify,
            )
            anonymous = case.call(base_url=dashboard_url, session=session, verify=session.verify)
            expected = 200 if case.path in OPEN_PATHS else 401
            assert anonymous.status_code == expected, (case.path, anonymous.text)

        conforms()
