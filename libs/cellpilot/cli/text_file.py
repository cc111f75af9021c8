"""Files a user names on the command line that must be text: read them, or say in one line why not.

A job spec, an ML configuration or a trace named by mistake — ``/bin/true``, a directory, a
device, a huge file, a file in another encoding — gets a message naming the file and what it
is instead (``/bin/true is not a text YAML file (binary data: a NUL byte at offset 24)``),
never a traceback. Nothing is read from a directory, device or FIFO (reading one could block
forever) and never more than the size limit.
"""

from __future__ import annotations

import codecs
import stat
from pathlib import Path

from cellpilot.units import MIB

SNIFF_BYTES = 64 * 1024  # how much of a large file is checked before another reader streams it

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


class TextFileError(Exception):
    """Why a file cannot be used as text: one line naming it."""


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n:,} bytes"


def _regular(path: Path, kind: str) -> int:
    """The file's size if it is a regular file we may open; TextFileError otherwise."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise TextFileError(f"{path}: no such file") from None
    except OSError as error:
        raise TextFileError(f"cannot read {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        what = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise TextFileError(f"{path} is not a text {kind} file (it is {what})")
    return info.st_size


def _read(path: Path, limit: int) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(limit)
    except OSError as error:
        raise TextFileError(f"cannot read {path}: {error.strerror or error}") from None


def _text(path: Path, kind: str, data: bytes, final: bool) -> str:
    """``data`` decoded as UTF-8 (a BOM dropped); ``final`` False allows a character cut at the end."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise TextFileError(f"{path} is not a text {kind} file (binary data: a NUL byte at offset {nul})")
    try:
        return codecs.getincrementaldecoder("utf-8-sig")().decode(data, final=final)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise TextFileError(
            f"{path} is not a text {kind} file (not UTF-8: byte 0x{data[error.start]:02x} at line {line}, "
            f"offset {error.start})"
        ) from None


def read_text_file(path: Path, kind: str, max_bytes: int) -> str:
    """The UTF-8 text of ``path`` (a ``kind`` file, e.g. "YAML"), at most ``max_bytes`` long."""
    size = _regular(path, kind)
    if size > max_bytes:
        raise TextFileError(
            f"{path} is not a text {kind} file ({_size(size)}: larger than the {_size(max_bytes)} allowed)"
        )
    data = _read(path, max_bytes + 1)
    if len(data) > max_bytes:  # it grew since, or stat does not know its size
        raise TextFileError(f"{path} is not a text {kind} file (larger than the {_size(max_bytes)} allowed)")
    return _text(path, kind, data, final=True)


def check_text_file(path: Path, kind: str) -> None:
    """That ``path`` is a readable regular file starting with UTF-8 text, for readers that stream
    large files themselves (traces); only its first :data:`SNIFF_BYTES` are read."""
    _regular(path, kind)
    _text(path, kind, _read(path, SNIFF_BYTES), final=False)


def check_readable_file(path: Path, kind: str) -> None:
    """That ``path`` is a regular file we may open (for compressed inputs, which are not text)."""
    _regular(path, kind)
    _read(path, 1)
