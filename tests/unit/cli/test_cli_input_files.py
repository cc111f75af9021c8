"""Files named on the command line that are not text — a program, a directory, binary data, a
huge file, another encoding, a device — get one line naming the file and what it is, exit 2, and
no traceback; nothing is submitted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cellpilot.cli.job import MAX_SPEC_BYTES
from cellpilot.cli.main import app
from cellpilot.cli.text_file import TextFileError, check_text_file, read_text_file

UNREACHABLE = [
    "--borgmaster",
    "127.0.0.1:1",
    "--timeout",
    "0.5",
]  # were anything sent, it would fail otherwise


def _submit(path: Path | str) -> Any:
    return CliRunner().invoke(app, ["job", "submit", str(path), *UNREACHABLE])


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    binary = tmp_path / "blob.yaml"
    binary.write_bytes(bytes(range(256)))
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: web\nuser: \xe9lise\n".encode("latin-1"))
    huge = tmp_path / "huge.yaml"
    huge.write_text("# padding\n" * (MAX_SPEC_BYTES // 10 + 1))
    return {
        "a-program": (Path(sys.executable).resolve(), "binary data: a NUL byte at offset"),
        "a-directory": (tmp_path, "it is a directory"),
        "binary-data": (binary, "binary data: a NUL byte at offset 0"),
        "not-utf-8": (latin, "not UTF-8: byte 0xe9 at line 2, offset 16"),
        "too-large": (huge, "larger than the 1.0 MiB allowed"),
        "a-device": (Path("/dev/null"), "it is a character device"),
    }


@pytest.mark.parametrize(
    "case", ["a-program", "a-directory", "binary-data", "not-utf-8", "too-large", "a-device"]
)
def test_job_submit_refuses_a_file_that_is_not_a_text_yaml_file_in_one_line(
    tmp_path: Path, case: str
) -> None:
    path, why = _bad_inputs(tmp_path)[case]
    result = _submit(path)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert lines == [f"error: {path} is not a text YAML file ({lines[0].split('(', 1)[1]}"]
    assert why in lines[0]
    assert result.stdout == ""


def test_job_submit_names_a_missing_or_unreadable_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = _submit(tmp_path / "nope.yaml")
    assert (missing.exit_code, missing.stderr.strip()) == (
        2,
        f"error: {tmp_path / 'nope.yaml'}: no such file",
    )
    spec = tmp_path / "web.yaml"
    spec.write_text("name: web\n")
    real_open = Path.open

    def denied(self: Path, *args: Any, **kwargs: Any) -> Any:  # fault injection: root may read anything
        if self == spec:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(TextFileError, match=f"^cannot read {spec}: Permission denied$"):
        read_text_file(spec, "YAML", MAX_SPEC_BYTES)
    unreadable = _submit(spec)
    assert (unreadable.exit_code, unreadable.stderr.strip()) == (
        2,
        f"error: cannot read {spec}: Permission denied",
    )


def test_a_text_file_is_read_and_a_cut_character_at_the_sniffed_end_is_fine(tmp_path: Path) -> None:
    spec = tmp_path / "web.yaml"
    spec.write_bytes("\ufeffname: wéb\n".encode())
    assert read_text_file(spec, "YAML", MAX_SPEC_BYTES) == "name: wéb\n"
    trace = tmp_path / "trace.csv"
    trace.write_bytes(b"a," * 32767 + "é".encode())  # the 65,536-byte sniff ends inside "é"
    check_text_file(trace, "CSV")


def test_the_real_command_on_bin_true_prints_one_line_and_no_traceback() -> None:
    program = Path("/bin/true") if Path("/bin/true").exists() else Path(sys.executable).resolve()
    done = subprocess.run(
        [sys.executable, "-m", "cellpilot.cli.main", "job", "submit", str(program), *UNREACHABLE],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: {program} is not a text YAML file ({done.stderr.split('(', 1)[1].rstrip()}"
    ]
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "gpa", "--instances", "1", "--trace", "{bad}"],
        ["eval", "autopilot", "--ml-config", "{bad}"],
        ["eval", "lava", "--hosts", "2", "--days", "0.01", "--trace", "azure:{bad}"],
        ["borgmaster", "replay", "--stack-env", "{bad}"],
    ],
    ids=["gpa-trace", "ml-config", "lava-trace", "stack-env"],
)
def test_the_other_commands_reading_files_refuse_binary_ones_too(tmp_path: Path, args: list[str]) -> None:
    bad = tmp_path / "blob"
    bad.write_bytes(b"\x7fELF\x02\x01\x01\x00")
    out = [] if args[0] == "borgmaster" else ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [a.format(bad=bad) for a in args] + out, env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    said = " ".join(result.output.replace("│", " ").split())  # click's error box
    assert f"{bad} is not a text" in said
    assert "binary data: a NUL byte at offset 7" in said
