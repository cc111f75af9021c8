"""The ``cellpilot job|cell|autopilot`` commands against a real Borgmaster and Borglet fleet.

Three 4-core / 8 GiB machines; a job that fits runs, one that asks for more CPU than any
machine has stays pending and ``why-pending`` says so; updates, kills, malformed YAML,
an unreachable Borgmaster and a missing Autopilot each get the answer a user needs.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cell_processes import grant_quota, running_cell, wait_for_machines
from stack_security import client_options, user_token
from typer.testing import CliRunner

from cellpilot.cli.main import app
from cellpilot.client import SyncCellpilotClient
from cellpilot.demo import grant_demo_quotas
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

pytestmark = pytest.mark.timeout(120)
USER = f"cli{uuid.uuid4().hex[:6]}"
WEB = f"""\
name: web
user: {USER}
priority: 9
app_class: latency-sensitive
task_count: 2
limits: {{cpu: 500m, memory: 1Gi}}
runtime:
  simulated: {{model: steady}}
"""
HUGE = (
    WEB.replace("name: web", "name: huge")
    .replace("cpu: 500m", "cpu: 16")
    .replace("task_count: 2", "task_count: 1")
)
MALFORMED = WEB.replace("limits: {cpu: 500m, memory: 1Gi}", "limits: {cpu: 500m, memroy: 1Gi}")


@pytest.fixture(scope="module")
def cell(
    endpoints: StackEndpoints, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[str]:
    database_url = request.getfixturevalue("module_database_url")
    log_dir = tmp_path_factory.mktemp("cli-logs")
    with running_cell(endpoints, database_url, log_dir, machines=3) as address:
        wait_for_machines(address, 3)
        grant_quota(address, USER)
        yield address


@pytest.fixture(scope="module")
def module_database_url(endpoints: StackEndpoints) -> Iterator[str]:
    import asyncio

    from sqlalchemy import make_url

    from cellpilot.platform.postgres import apply_migrations, drop_database, ensure_database

    url = str(make_url(endpoints.postgres_url).set(database=f"cli_{uuid.uuid4().hex[:10]}"))
    asyncio.run(ensure_database(url))
    asyncio.run(apply_migrations(url))
    yield url
    asyncio.run(drop_database(url))


def cli(*args: str, token: str | None = None) -> Any:
    """``cellpilot ARGS`` as USER (CELLPILOT_TOKEN), over mTLS with the stack's certificates."""
    env = {"CELLPILOT_TOKEN": user_token(USER) if token is None else token}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def cli_json(*args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def eventually(check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


def test_submit_list_show_update_kill(cell: str, tmp_path: Path) -> None:
    spec = tmp_path / "web.yaml"
    spec.write_text(WEB)
    submitted = cli("job", "submit", str(spec), "--borgmaster", cell)
    assert submitted.exit_code == 0, submitted.output
    assert f"submitted {USER}/web" in submitted.output

    listed = cli_json("job", "list", "--user", USER, "--borgmaster", cell)
    assert [j["job_id"] for j in listed] == [f"{USER}/web"]

    def running() -> Any:
        job = cli_json("job", "show", f"{USER}/web", "--borgmaster", cell)
        tasks = job.get("tasks", [])
        return job if len(tasks) == 2 and all(t.get("state") == "TASK_STATE_RUNNING" for t in tasks) else None

    job = eventually(running)
    assert job, "the job's two tasks never ran"
    assert {t["machine_id"] for t in job["tasks"]} <= {
        m["spec"]["machine_id"] for m in cli_json("cell", "machines", "--borgmaster", cell)
    }
    assert job["spec"]["task"]["limits"]["cpu_millicores"] == "500"

    human = cli("job", "show", f"{USER}/web", "--borgmaster", cell)
    assert human.exit_code == 0
    assert "running" in human.output

    updated = cli_json(
        "job", "update", f"{USER}/web", "--tasks", "3", "--memory", "2Gi", "--borgmaster", cell
    )
    assert updated["job"]["spec_version"] == "2"
    assert updated["job"]["spec"]["task_count"] == 3
    assert updated["job"]["spec"]["task"]["limits"]["memory_bytes"] == str(2 << 30)

    killed = cli("job", "kill", f"{USER}/web", "--borgmaster", cell)
    assert killed.exit_code == 0, killed.output
    state = eventually(
        lambda: cli_json("job", "show", f"{USER}/web", "--borgmaster", cell)["state"] == "JOB_STATE_DEAD"
    )
    assert state, "the killed job never became dead"


def test_why_pending_names_the_missing_cpu(cell: str, tmp_path: Path) -> None:
    spec = tmp_path / "huge.yaml"
    spec.write_text(HUGE)
    assert cli("job", "submit", str(spec), "--borgmaster", cell).exit_code == 0
    answer = eventually(
        lambda: cli_json("job", "why-pending", f"{USER}/huge", "--borgmaster", cell).get("summary")
    )
    assert answer
    why = cli_json("job", "why-pending", f"{USER}/huge", "--borgmaster", cell)
    assert why["task_state"] == "TASK_STATE_PENDING"
    assert why.get("machines_feasible", 0) == 0
    cpu = [r for r in why["resource_exclusions"] if r["resource"] == "RESOURCE_CPU"]
    assert cpu
    assert cpu[0]["machines_excluded"] == 3
    human = cli("job", "why-pending", f"{USER}/huge", "--borgmaster", cell)
    assert "not enough cpu on 3 machines" in human.output

    quota = cli_json("cell", "quota", "--user", USER, "--borgmaster", cell)
    assert {q["band"] for q in quota} == {"PRIORITY_BAND_PRODUCTION", "PRIORITY_BAND_BATCH"}


def test_malformed_yaml_names_line_and_field(cell: str, tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(MALFORMED)
    result = cli("job", "submit", str(spec), "--borgmaster", cell)
    assert result.exit_code == 2
    assert "line 6" in result.output
    assert "limits.memroy" in result.output
    assert "memory" in result.output
    spec.write_text("name: web\nuser: [unclosed\n")
    result = cli("job", "submit", str(spec), "--borgmaster", cell)
    assert result.exit_code == 2
    assert "not valid YAML" in result.output
    assert "line 3" in result.output


def test_a_spec_the_server_would_refuse_is_refused_at_its_line_before_submission(
    cell: str, tmp_path: Path
) -> None:
    """The CLI runs the Borgmaster's own admission checks: an unknown usage model or parameter
    names its YAML line and the API field, and nothing reaches the server."""
    spec = tmp_path / "typo.yaml"
    spec.write_text(WEB.replace("name: web", "name: typo").replace("{model: steady}", "{model: nope}"))
    result = cli("job", "submit", str(spec), "--borgmaster", cell)
    assert result.exit_code == 2, result.output
    assert "line 8" in result.output
    assert "runtime.simulated.model" in result.output
    assert "unknown usage model 'nope'" in result.output
    spec.write_text(
        WEB.replace("name: web", "name: typo").replace(
            "{model: steady}", "{model: diurnal, params: {base_cpu_millicores: 300}}"
        )
    )
    result = cli("job", "submit", str(spec), "--borgmaster", cell)
    assert result.exit_code == 2, result.output
    assert "spec.task.runtime.simulated.params.base_cpu_millicores" in " ".join(result.output.split())
    assert cli("job", "show", f"{USER}/typo", "--borgmaster", cell).exit_code == 1, "never submitted"


def test_a_crash_looping_task_shows_its_backoff(cell: str, tmp_path: Path) -> None:
    spec = tmp_path / "crash.yaml"
    spec.write_text(
        WEB.replace("name: web", "name: crash")
        .replace("task_count: 2", "task_count: 1")
        .replace("simulated: {model: steady}", "process: {command: /nonexistent/cellpilot-crash}")
    )
    assert cli("job", "submit", str(spec), "--borgmaster", cell).exit_code == 0

    def backing_off() -> Any:
        task = cli_json("job", "show", f"{USER}/crash", "--borgmaster", cell)["tasks"][0]
        return task if int(task.get("failures", 0)) >= 2 else None

    task = eventually(backing_off, 30)
    assert task, "the task never failed twice"
    assert "could not start" in task["last_failure"]
    assert int(task["next_restart_ms"]) >= int(task["last_failure_ms"])
    human = " ".join(cli("job", "show", f"{USER}/crash", "--borgmaster", cell).output.split())
    assert "failure(s) in a row, the last at" in human
    assert "could not start" in human
    assert cli("job", "kill", f"{USER}/crash", "--borgmaster", cell).exit_code == 0


def test_unreachable_services_get_clear_messages(cell: str, tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    result = cli("job", "list", "--borgmaster", nobody, "--timeout", "1")
    assert result.exit_code == 1
    assert "cannot reach the service (ListJobs)" in result.output
    assert "cellpilot run" in result.output

    missing = cli("job", "show", f"{USER}/nope", "--borgmaster", cell)
    assert missing.exit_code == 1
    assert "not found" in missing.output

    # Autopilot not running: `autopilot show` degrades to the Borgmaster's view and says so.
    spec = tmp_path / "web.yaml"
    spec.write_text(WEB.replace("name: web", "name: quiet"))
    assert cli("job", "submit", str(spec), "--borgmaster", cell).exit_code == 0
    shown = cli(
        "autopilot", "show", f"{USER}/quiet", "--borgmaster", cell, "--autopilot", nobody, "--timeout", "1"
    )
    assert shown.exit_code == 0, shown.output
    assert "Autopilot is not reachable" in shown.output
    assert "0.5 cores" in shown.output


def test_commands_need_a_token_and_act_only_as_its_user(cell: str, tmp_path: Path) -> None:
    spec = tmp_path / "web.yaml"
    spec.write_text(WEB.replace("name: web", "name: guarded"))
    anonymous = cli("job", "submit", str(spec), "--borgmaster", cell, token="")
    assert anonymous.exit_code == 1
    assert "not authenticated" in anonymous.output
    assert "CELLPILOT_TOKEN" in anonymous.output
    submitted = cli("--token", user_token(USER), "job", "submit", str(spec), "--borgmaster", cell, token="")
    assert submitted.exit_code == 0, submitted.output
    intruder = cli("job", "kill", f"{USER}/guarded", "--borgmaster", cell, token=user_token("mallory"))
    assert intruder.exit_code == 1
    assert "permission denied" in intruder.output
    assert "mallory" in intruder.output
    assert cli_json("job", "show", f"{USER}/guarded", "--borgmaster", cell)["state"] != "JOB_STATE_DEAD"
    assert cli("job", "kill", f"{USER}/guarded", "--borgmaster", cell).exit_code == 0


def test_cell_status_reports_the_fit_test_the_observed_cpu_overflow_and_the_schedulers_proposals(
    cell: str, tmp_path: Path
) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(WEB.replace("name: web", "name: tiny").replace("task_count: 2", "task_count: 1"))
    assert cli("job", "submit", str(spec), "--borgmaster", cell).exit_code == 0

    def placed() -> Any:
        tasks = cli_json("job", "show", f"{USER}/tiny", "--borgmaster", cell).get("tasks", [])
        return tasks and tasks[0].get("state") == "TASK_STATE_RUNNING"

    assert eventually(placed), "the scheduler never placed the task"
    status = cli_json("cell", "status", "--borgmaster", cell)
    assert status.get("is_leader") is True, "asked of the master, where the poll samples are"
    assert status.get("gpa_rho", 0) == 0
    human = cli("cell", "status", "--borgmaster", cell)
    assert human.exit_code == 0, human.output
    assert "non-prod CPU fit by CPU limits (GPA off)" in human.output
    assert "CPU overflow (machine demand > capacity)" in human.output
    assert cli("job", "kill", f"{USER}/tiny", "--borgmaster", cell).exit_code == 0
    # The task was placed by the scheduler process and accepted by the master (Borg §3.4).
    assert int(status.get("placements_accepted", 0)) > 0, status
    assert re.search(r"\d+ placements accepted, \d+ refused as stale", " ".join(human.output.split()))


def test_train_lifetimes_says_how_much_history_the_cell_has(cell: str) -> None:
    admin = user_token()
    refused = cli("cell", "train-lifetimes", "--min-runs", "100000", "--borgmaster", cell, token=admin)
    assert refused.exit_code == 1
    said = " ".join(refused.output.split())
    assert re.search(r"the cell's checkpoint log holds \d+ finished task runs", said), said
    assert "training needs at least 100000 (min_runs)" in said
    shown = cli("cell", "lifetimes", "--borgmaster", cell)
    assert shown.exit_code == 0, shown.output
    assert "placement policy best-fit; no lifetime model" in shown.output


def test_an_admin_sets_a_quota_resource_by_resource_and_a_user_cannot(cell: str) -> None:
    admin = user_token()

    def carol_production() -> dict[str, Any]:
        result = cli("cell", "quota", "--user", "carol", "--json", "--borgmaster", cell)
        assert result.exit_code == 0, result.output
        return next(q for q in json.loads(result.stdout) if q.get("band") == "PRIORITY_BAND_PRODUCTION")

    set_cpu = cli(
        "cell", "set-quota", "carol", "--cpu", "16", "--memory", "64Gi", "--borgmaster", cell, token=admin
    )
    assert set_cpu.exit_code == 0, set_cpu.output
    set_disk = cli("cell", "set-quota", "carol", "--disk", "100Gi", "--borgmaster", cell, token=admin)
    assert set_disk.exit_code == 0, set_disk.output
    limit = carol_production()["limit"]
    # --disk alone kept the CPU and memory set before
    assert (int(limit["cpu_millicores"]), int(limit["memory_bytes"]), int(limit["disk_bytes"])) == (
        16_000,
        64 << 30,
        100 << 30,
    )
    refused = cli(
        "cell", "set-quota", "carol", "--cpu", "1000", "--borgmaster", cell, token=user_token("carol")
    )
    assert refused.exit_code == 1
    assert "permission denied" in refused.output
    assert int(carol_production()["limit"]["cpu_millicores"]) == 16_000
    bad_band = cli(
        "cell", "set-quota", "carol", "--band", "prod", "--cpu", "1", "--borgmaster", cell, token=admin
    )
    assert bad_band.exit_code == 2
    assert "--band" in bad_band.output
    bad_memory = cli("cell", "set-quota", "carol", "--memory", "lots", "--borgmaster", cell, token=admin)
    assert bad_memory.exit_code == 2
    assert "--memory" in bad_memory.output


def test_the_readmes_first_command_works_on_the_demo_cells_quotas(cell: str) -> None:
    """``cellpilot job submit examples/web.yaml`` as its user, alice, on a cell with the quotas
    ``make run``'s demo grants; then ``job list`` in a pipe (80 columns) shows the whole job id."""
    with SyncCellpilotClient([cell], **client_options()) as admin:
        grant_demo_quotas(admin)
    alice = user_token("alice")
    example = Path(__file__).resolve().parents[3] / "examples" / "web.yaml"
    submitted = cli("job", "submit", str(example), "--borgmaster", cell, token=alice)
    assert submitted.exit_code == 0, submitted.output
    assert "submitted alice/web" in submitted.output
    try:
        listed = cli("job", "list", "--user", "alice", "--borgmaster", cell, token=alice)
        assert listed.exit_code == 0, listed.output
        assert "alice/web" in listed.output
        assert all(len(line) <= 80 for line in listed.output.splitlines()), listed.output
        wide = cli("job", "list", "--user", "alice", "-o", "wide", "--borgmaster", cell, token=alice)
        assert "autopilot" in wide.output
        assert "-o wide adds" not in wide.output
    finally:
        assert cli("job", "kill", "alice/web", "--borgmaster", cell, token=alice).exit_code == 0
