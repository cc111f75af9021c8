"""The short chaos run (``python -m cellpilot.chaos --short``; ``make chaos`` runs the full one).

The whole system under ``cellpilot run`` (its own data directory and ports) with the demo
workload; while it runs, a forger writes actuations with a fencing token of 10^12, samples and
recommendations with a plain Kafka client and copies genuine records, the Borgmaster master and
the actuator are SIGKILLed and the broker is killed and restarted (the supervisor restarts
each), and a poison job (refused at admission), a job whose command does not exist and a
crash-looping job are submitted. The invariants: no forged record applied and each one refused,
every acknowledged job is still there, no machine was marked DOWN, no actuation was applied
twice, fencing tokens never went back, no usage window was folded in twice, and Autopilot acted
again (re-sized its probe job) within 45 s of each fault.

Slow by design (about 110 s on 2 cores: the whole stack starts, four faults, the stop); it runs
in the default suite because it is the one test that breaks everything at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
RUN_LIMIT_S = 300  # the run's own bounds end it well before; this only stops a hung one


def test_the_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    out = tmp_path / "chaos-results.json"
    # The run is self-contained: none of this test session's stack settings reach it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELLPILOT_")}
    began = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "cellpilot.chaos", "--short", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        env=env,
    )
    took = time.monotonic() - began
    print(run.stdout)
    print(f"short chaos run: {took:.0f} s wall")
    assert run.returncode == 0, f"{run.stderr[-4000:]}\n{run.stdout[-4000:]}"
    document = json.loads(out.read_text())
    figures = {name: figure["value"] for name, figure in document["figures"].items()}
    assert document["invariants_held"]
    assert figures["jobs_acknowledged"] >= 9, "the demo's 5, one per fault, the two poison jobs accepted"
    assert figures["jobs_acknowledged_missing"] == 0
    assert figures["machines_marked_down"] == 0
    assert figures["actuations_applied_twice"] == 0
    assert figures["fencing_token_decreases"] == figures["fencing_token_decreases_per_job"] == 0
    assert figures["fencing_token_decreases_on_topic"] == 0
    assert figures["windows_double_applied"] == figures["histogram_windows_conflicting"] == 0
    assert figures["forged_records_written"] >= 5
    assert figures["forged_records_applied"] == 0
    assert figures["forged_records_unrefused"] == 0
    assert figures["fencing_token_highest"] < 10**12
    assert figures["poison_refused_invalid_argument"] == 1
    assert figures["missing_command_task_failures"] >= 1
    assert figures["crash_loop_task_failures"] >= 1
    acted = {name: value for name, value in figures.items() if name.startswith("autopilot_acts_again.")}
    assert set(acted) == {
        "autopilot_acts_again.forge_records",
        "autopilot_acts_again.kill_borgmaster_master",
        "autopilot_acts_again.kill_actuator_with_poison",
        "autopilot_acts_again.restart_broker",
    }
    assert all(value is not None and value <= 45 for value in acted.values()), acted
    lines = [line for line in run.stdout.splitlines() if line.startswith("CHAOS ")]
    assert len(lines) == len(figures), "one CHAOS line per figure"
