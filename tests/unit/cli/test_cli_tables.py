"""The CLI's one table renderer (:func:`cellpilot.cli.output.print_table`) in an 80-column
terminal or a pipe: identifiers are never cut, the least important columns give way and say so,
``-o wide`` shows every column (kubectl's habit)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import typer
from rich.console import Console

from cellpilot.api.v1 import job_pb2, resources_pb2, state_pb2
from cellpilot.cli import output
from cellpilot.cli.job import JOB_COLUMNS, TASK_COLUMNS


def _job(name: str, state: int = state_pb2.JOB_STATE_RUNNING) -> state_pb2.JobStatus:
    spec = job_pb2.JobSpec(name=name, user="demo", priority=9, task_count=12)
    spec.task.limits.CopyFrom(resources_pb2.Resources(cpu_millicores=4000, memory_bytes=4 << 30))
    spec.autopilot.cpu.mode = job_pb2.SCALING_MODE_ON
    spec.autopilot.memory.mode = job_pb2.SCALING_MODE_DRY_RUN
    spec.autopilot.horizontal.mode = job_pb2.SCALING_MODE_ON
    status = state_pb2.JobStatus(job_id=f"demo/{name}", spec=spec, state=state)
    status.task_counts.pending, status.task_counts.running = 2, 10
    return status


JOBS = [
    _job("web-fat"),
    _job("a-job-with-a-rather-long-name-indeed", state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT),
    _job("crunch", state_pb2.JOB_STATE_PENDING),
]


class Screen:
    """The CLI's console as a pipe of a given width, and what was printed on it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.out = io.StringIO()
        self.monkeypatch = monkeypatch
        self.width = 80

    @property
    def width(self) -> int:
        return self._width

    @width.setter
    def width(self, columns: int) -> None:
        self._width = columns
        self.monkeypatch.setattr(output, "console", Console(file=self.out, width=columns, color_system=None))


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> Iterator[Screen]:
    output.use_output("")
    yield Screen(monkeypatch)
    output.use_output("")


def _lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_in_80_columns_every_job_id_is_whole_and_less_important_columns_give_way(
    screen: Screen,
) -> None:
    out = screen.out
    output.print_table("3 jobs", JOB_COLUMNS, JOBS)
    text = out.getvalue()
    for job in JOBS:
        assert job.job_id in text, text
    assert "held-for-autopilot" in text  # the state, whole
    assert " 9 " in text  # the priority
    assert all(len(line) <= 80 for line in _lines(out)), text
    assert "…" not in text
    caption = _lines(out)[-1]
    assert caption.startswith("-o wide adds ")
    assert "autopilot" in caption
    assert "job" not in caption


def test_with_o_wide_every_column_is_shown_whatever_the_width(screen: Screen) -> None:
    out = screen.out
    output.use_output("wide")
    output.print_table("3 jobs", JOB_COLUMNS, JOBS)
    header = next(line for line in _lines(out) if "job" in line and "state" in line)
    for column in JOB_COLUMNS:
        assert column.header in header
    assert "cpu:on mem:dry-run tasks:on" in out.getvalue()
    assert "-o wide adds" not in out.getvalue()
    assert max(len(line) for line in _lines(out)) > 80


def test_in_a_very_narrow_terminal_identifiers_stay_whole_and_one_other_column_folds(
    screen: Screen,
) -> None:
    out = screen.out
    screen.width = 30
    output.print_table(None, JOB_COLUMNS, JOBS)
    text = out.getvalue()
    for job in JOBS:
        assert any(job.job_id in line for line in _lines(out)), text
    assert "state" in text  # the first column after the identifier is kept
    assert "priority" not in text.split("-o wide adds")[0]


def test_a_table_that_fits_is_left_alone(screen: Screen) -> None:
    out = screen.out
    screen.width = 200
    task = state_pb2.TaskStatus(task_index=3, state=state_pb2.TASK_STATE_RUNNING, machine_id="machine-0017")
    output.print_table(None, TASK_COLUMNS, [task])
    assert "-o wide adds" not in out.getvalue()
    assert all(column.header in out.getvalue() for column in TASK_COLUMNS)


@pytest.mark.parametrize(
    ("given", "as_json", "wide"), [("", False, False), ("wide", False, True), ("json", True, False)]
)
def test_the_output_option(given: str, as_json: bool, wide: bool) -> None:
    assert output.use_output(given) is as_json
    assert output._tables["wide"] is wide
    output.use_output("")


def test_an_unknown_output_format_is_refused_naming_the_option() -> None:
    with pytest.raises(typer.BadParameter, match="one of wide, json"):
        output.use_output("yaml")
