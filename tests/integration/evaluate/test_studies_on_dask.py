"""Every study gives the same answer on a two-worker Dask LocalCluster as in one process.

The shards run in the cluster's worker processes (the context scattered to them, the
per-shard functions imported there); the results must be identical, not just close: the
shards carry their own seeds and are combined in shard order. Also: ``--dask local`` on the
command line, and a clear one-line error for a scheduler that cannot be reached.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cellpilot.cli.main import app
from cellpilot.evaluate import autopilot_replay, compaction, gpa_study, lava_study
from cellpilot.evaluate.autopilot_deciders import STANDARD_RECOMMENDERS
from cellpilot.evaluate.replay_machines import CellModel
from cellpilot.evaluate.sharding import IN_PROCESS
from cellpilot.lifetimes.model import TrainingParams
from cellpilot.platform.dask_shards import DaskShards, dask_runner
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig


@pytest.fixture(scope="module")
def cluster() -> Iterator[DaskShards]:
    with dask_runner("local", workers=2) as runner:
        yield runner


def test_two_workers_are_separate_processes(cluster: DaskShards) -> None:
    pids = cluster.map(lambda _, __: os.getpid(), None, list(range(8)))
    assert os.getpid() not in pids
    assert cluster.workers == 2


def test_autopilot_replay_is_identical_on_the_cluster(cluster: DaskShards) -> None:
    workload = AutopilotWorkloadConfig(jobs=4, days=2, seed=6, max_tasks=4, with_cpu=True)
    specs = [STANDARD_RECOMMENDERS[name] for name in ("manual-soft", "moving-window", "ml", "vpa")]
    # Pools of one job: each job on its own machines, so every chunk is one job.
    config = autopilot_replay.ReplayConfig(warmup_days=1, cpu=True, cell=CellModel(pool_jobs=1))
    seen: list[int] = []
    local = autopilot_replay.run_study(workload, specs, config, runner=IN_PROCESS, max_chunk_tasks=4)
    remote = autopilot_replay.run_study(
        workload, specs, config, runner=cluster, max_chunk_tasks=4, progress=lambda d, _: seen.append(d)
    )
    assert len(seen) > 2  # several chunks, each reported as it finished
    assert seen[-1] == 4 * 2
    assert remote.summaries == local.summaries
    for name, rows in local.rows.items():
        for field in dataclasses.fields(rows):
            np.testing.assert_array_equal(getattr(remote.rows[name], field.name), getattr(rows, field.name))


def test_lava_study_is_identical_on_the_cluster(cluster: DaskShards) -> None:
    config = lava_study.StudyConfig(
        hosts=8, days=1.0, history_days=1.0, warmup_days=0.1, training=TrainingParams(num_trees=20)
    )
    seen: dict[str, float] = {}
    local = lava_study.run_study(config)
    remote = lava_study.run_study(config, lambda label, f: seen.__setitem__(label, f), runner=cluster)
    assert json.dumps(remote, sort_keys=True) == json.dumps(local, sort_keys=True)
    assert seen["lava-model"] == 1.0
    assert seen[lava_study.LARS_RUN] == 1.0


def test_gpa_and_compaction_are_identical_on_the_cluster(cluster: DaskShards) -> None:
    gpa = gpa_study.GpaStudyConfig(instances=4, tasks=60, realizations=300, seed=3)
    assert gpa_study.run_study(gpa, runner=cluster) == gpa_study.run_study(gpa)
    packing = compaction.CompactionConfig(machines=20, tasks=80, seeds=3)
    assert compaction.run_compaction(packing, runner=cluster) == compaction.run_compaction(packing)


def _summary(out: Path) -> Any:
    return json.loads((out / "summary.json").read_text())


def test_cli_dask_local_gives_the_in_process_summary(tmp_path: Path) -> None:
    args = ["eval", "compaction", "--machines", "20", "--tasks", "80", "--seeds", "2"]
    here = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "here")])
    there = CliRunner().invoke(app, [*args, "--dask", "local", "--out", str(tmp_path / "there")])
    assert here.exit_code == 0, here.output
    assert there.exit_code == 0, there.output
    assert _summary(tmp_path / "there") == _summary(tmp_path / "here")


def test_unreachable_scheduler_is_reported() -> None:
    unreachable = r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:9"
    with pytest.raises(OSError, match=unreachable), dask_runner("tcp://127.0.0.1:9", connect_timeout=1.0):
        pass


def test_malformed_scheduler_address_is_a_usage_error(tmp_path: Path) -> None:
    args = ["eval", "compaction", "--machines", "20", "--tasks", "80", "--seeds", "1"]
    result = CliRunner().invoke(app, [*args, "--dask", "nowhere", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "not a scheduler address" in result.output
    assert not (tmp_path / "summary.json").exists()
