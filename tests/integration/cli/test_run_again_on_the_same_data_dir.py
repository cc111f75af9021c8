"""`cellpilot run`, stop, `cellpilot run` again on the same data directory: Autopilot acts.

What a user does with `make run`: the whole system on a data directory, the demo workload,
Autopilot right-sizing it; Ctrl-C; `make run` again. The second run finds PostgreSQL and
Redis as they were (aggregator windows closed through the last event time, recommender and
Autopilot master state, stored Kafka positions) but an empty broker (it keeps records in
memory only) and a Borglet fleet that starts again. Right after the second start the demo's
over-provisioned job gets its 4 cores / 4 GiB back (a user's edit): within 60 s of the
second start an actuation must be applied (the restarted actuator's counter), which takes
new usage windows all the way through: the fleet's event clock went on from where it
stopped (no sample is late) and every consumer followed the broker's new logs.

It uses the fixed ports of `cellpilot run` (7100-7600, 8080, 8400-8600): skipped while a
`cellpilot run` of someone else holds them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cellpilot.api.v1 import job_pb2
from cellpilot.cli.output import DEFAULT_AUTOPILOT, DEFAULT_BORGMASTER, DEFAULT_MONITORING
from cellpilot.client import RetryPolicy, SyncCellpilotClient
from cellpilot.security.tls import SecuritySettings
from cellpilot.stack.config import port_in_use

# The fixed ports: every test that uses them runs in one worker, one after the other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fixed-ports")]
RUN_PORTS = (7100, 7101, 7102, 7300, 7301, 7400, 7401, 7600, 8080, 8600)
ACTUATOR_METRICS = "http://127.0.0.1:8600/metrics"
GIB = 1 << 30


def cellpilot(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    # The suite's own stack settings (certificates, identities) must not leak into this one.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELLPILOT_")}
    return subprocess.run(
        [sys.executable, "-m", "cellpilot.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def actuations_applied() -> float:
    try:
        text = urllib.request.urlopen(ACTUATOR_METRICS, timeout=2).read().decode()
    except OSError:
        return 0.0
    values = [
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("cellpilot_actuations_total")
    ]
    return values[0] if values else 0.0


def wait_until(check: object, timeout_s: float, what: str) -> float:
    """Seconds it took for ``check()`` to hold."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(1.0)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def client(data_dir: Path) -> SyncCellpilotClient:
    options = SecuritySettings.load(data_dir / "stack.env").client_options()
    options["token"] = (data_dir / "demo-token").read_text().strip()
    return SyncCellpilotClient(
        DEFAULT_BORGMASTER.split(","),
        DEFAULT_AUTOPILOT.split(","),
        DEFAULT_MONITORING.split(","),
        policy=RetryPolicy(budget_s=30.0, call_timeout_s=10.0),
        **options,
    )


def limits(cell: SyncCellpilotClient, job_id: str) -> tuple[int, int]:
    spec = cell.borgmaster.get_job(job_id).job.spec
    return spec.task.limits.cpu_millicores, spec.task.limits.memory_bytes


def give_back_four_cores(cell: SyncCellpilotClient, job_id: str) -> None:
    spec = job_pb2.JobSpec()
    spec.task.limits.cpu_millicores = 4000
    spec.task.limits.memory_bytes = 4 * GIB
    cell.borgmaster.update_job(job_id, spec, ["task.limits.cpu_millicores", "task.limits.memory_bytes"])


def test_a_second_run_on_the_same_data_directory_has_autopilot_acting_within_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = [port for port in RUN_PORTS if port_in_use("127.0.0.1", port)]
    if busy:
        pytest.skip(f"ports {busy} are taken (a `cellpilot run` is up?)")
    for name in [k for k in os.environ if k.startswith("CELLPILOT_")]:
        monkeypatch.delenv(name)
    data_dir = tmp_path / "stack"
    fat = "demo/web-fat"  # asks 4 cores / 4 GiB, uses 0.4 core / 300 MiB
    try:
        first = cellpilot("run", "--data-dir", str(data_dir), "--detach")
        assert first.returncode == 0, first.stderr[-3000:]
        with client(data_dir) as cell:
            wait_until(lambda: limits(cell, fat)[0] < 4000, 150, "Autopilot right-sizing the demo's web-fat")
        stopped = cellpilot("stop", "--data-dir", str(data_dir))
        assert stopped.returncode == 0, stopped.stderr[-3000:]

        restarted_at = time.monotonic()
        second = cellpilot("run", "--data-dir", str(data_dir), "--detach")
        assert second.returncode == 0, second.stderr[-3000:]
        assert "Demo workload submitted" in second.stderr
        with client(data_dir) as cell:
            give_back_four_cores(cell, fat)
            left = 60 - (time.monotonic() - restarted_at)
            # The restarted actuator's own counter: every actuation it counts came after the restart.
            took = wait_until(
                lambda: actuations_applied() >= 1, left, "an actuation within 60 s of the restart"
            )
            print(f"an actuation applied {60 - left + took:.0f} s after the second start")
            wait_until(lambda: limits(cell, fat)[0] < 4000, 60, "web-fat right-sized again")
    finally:
        cellpilot("stop", "--data-dir", str(data_dir))
