"""The ``--dask`` / ``--workers`` options of ``cellpilot eval``: which runner they choose."""

from __future__ import annotations

import pytest
import typer

from cellpilot.cli.study_runner import bare_dask_means_local, study_runner
from cellpilot.evaluate.sharding import IN_PROCESS


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["eval", "gpa", "--dask"], ["eval", "gpa", "--dask", "local"]),
        (["eval", "gpa", "--dask", "--out", "x"], ["eval", "gpa", "--dask", "local", "--out", "x"]),
        (["eval", "gpa", "--dask", "tcp://h:8786"], ["eval", "gpa", "--dask", "tcp://h:8786"]),
        (["eval", "gpa", "--out", "x"], ["eval", "gpa", "--out", "x"]),
    ],
    ids=["last", "before-an-option", "with-address", "absent"],
)
def test_a_bare_dask_option_means_a_local_cluster(argv: list[str], expected: list[str]) -> None:
    assert bare_dask_means_local(argv) == expected


def test_one_worker_and_no_cluster_runs_in_process() -> None:
    with study_runner(None, 1) as runner:
        assert runner is IN_PROCESS
        assert runner.workers == 1
        assert runner.map(lambda context, shard: context * shard, 3, [1, 2, 3]) == [3, 6, 9]


@pytest.mark.parametrize(("dask", "workers"), [(None, 0), ("not-an-address", 2)], ids=["workers", "address"])
def test_bad_options_are_usage_errors(dask: str | None, workers: int) -> None:
    with pytest.raises(typer.BadParameter), study_runner(dask, workers):
        pass
