"""The single code generation command for the Cellpilot API (docs/architecture.md rule 8).

Compiles every ``proto/cellpilot/api/v1/*.proto`` with ``grpc_tools.protoc`` (from the pinned
grpcio-tools) into ``libs/cellpilot/api/v1/``: messages (``--python_out``), gRPC stubs and
servicers (``--grpc_python_out``) and their type stubs (mypy-protobuf's ``--mypy_out`` and
``--mypy_grpc_out``), so code imports ``from cellpilot.api.v1 import job_pb2``. The whole
``libs/cellpilot/api`` package is generated, ``__init__.py`` files included, and never edited
by hand.

Usage::

    .venv/bin/python infra/proto/generate.py           # regenerate libs/cellpilot/api
    .venv/bin/python infra/proto/generate.py --check   # exit 1 if the committed code is stale

``--root`` points at another checkout (tests use it on a copy).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
API_VERSION = "v1"
PACKAGE_PATH = Path("cellpilot", "api")  # relative to proto/ and to libs/
PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")
SERVICE = re.compile(r"^service\s", re.MULTILINE)
REGENERATE_HINT = "run `.venv/bin/python infra/proto/generate.py` (make proto) and commit the result"

HEADER = "# Generated from {source} by infra/proto/generate.py; do not edit.\n"

API_INIT = '''"""Generated protobuf and gRPC code of the Cellpilot API.

Generated code lives here: every module under this package is produced by
``infra/proto/generate.py`` (``make proto``) from the ``.proto`` files in ``proto/`` and is
never edited by hand; ``make proto-check`` fails when it is stale. Versions are
sub-packages (``cellpilot.api.v1``). The core libraries never import this package: services
convert wire types to plain data at their edge.
"""
'''

VERSION_INIT = '''"""Generated code of the protobuf package ``cellpilot.api.{version}``."""
'''


@dataclass(frozen=True)
class Layout:
    """Where the sources are and where the generated package goes, for one checkout."""

    root: Path

    @property
    def proto_dir(self) -> Path:
        return self.root / "proto"

    @property
    def libs_dir(self) -> Path:
        return self.root / "libs"

    @property
    def api_dir(self) -> Path:
        return self.libs_dir / PACKAGE_PATH

    def proto_files(self) -> list[Path]:
        return sorted((self.proto_dir / PACKAGE_PATH / API_VERSION).glob("*.proto"))


def _plugin_path(name: str) -> str:
    """The mypy-protobuf plugin next to the running interpreter (the venv), else on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev dependencies (mypy-protobuf)")
    return found


def _run_protoc(layout: Layout, out_dir: Path) -> None:
    sources = layout.proto_files()
    if not sources:
        raise SystemExit(f"no .proto files under {layout.proto_dir / PACKAGE_PATH / API_VERSION}")
    # `python -m grpc_tools.protoc` adds the well-known types (google/protobuf/*.proto) itself.
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{layout.proto_dir}",
        *(f"--plugin={name}={_plugin_path(name)}" for name in PLUGINS),
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(path) for path in sources),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    # mypy-protobuf reports every file it writes on stderr; keep only the real diagnostics.
    diagnostics = [line for line in result.stderr.splitlines() if not line.startswith("Writing mypy to ")]
    if diagnostics:
        print("\n".join(diagnostics), file=sys.stderr)
    if result.returncode != 0:
        raise SystemExit(f"protoc failed with exit code {result.returncode}")


def _drop_empty_grpc_modules(layout: Layout, out_dir: Path) -> None:
    """grpc_python_out writes a ``_pb2_grpc`` module for every file; keep those with services."""
    for source in layout.proto_files():
        if not SERVICE.search(source.read_text()):
            for suffix in ("_pb2_grpc.py", "_pb2_grpc.pyi"):
                (out_dir / PACKAGE_PATH / API_VERSION / f"{source.stem}{suffix}").unlink()


def _add_headers(out_dir: Path) -> None:
    version_dir = out_dir / PACKAGE_PATH / API_VERSION
    for path in sorted(version_dir.iterdir()):
        stem = path.name.split("_pb2")[0]
        source = f"proto/{PACKAGE_PATH.as_posix()}/{API_VERSION}/{stem}.proto"
        path.write_text(HEADER.format(source=source) + path.read_text())


def _write_inits(out_dir: Path) -> None:
    header = HEADER.format(source="proto/")
    (out_dir / PACKAGE_PATH / "__init__.py").write_text(header + API_INIT)
    version_init = VERSION_INIT.format(version=API_VERSION)
    (out_dir / PACKAGE_PATH / API_VERSION / "__init__.py").write_text(header + version_init)


def generate_into(layout: Layout, out_dir: Path) -> Path:
    """Generate the whole ``cellpilot/api`` package under ``out_dir``; returns its path."""
    _run_protoc(layout, out_dir)
    _drop_empty_grpc_modules(layout, out_dir)
    _add_headers(out_dir)
    _write_inits(out_dir)
    return out_dir / PACKAGE_PATH


def _files(tree: Path) -> set[Path]:
    """Files under ``tree`` relative to it, ignoring bytecode caches."""
    if not tree.is_dir():
        return set()
    return {p.relative_to(tree) for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@dataclass(frozen=True)
class Drift:
    stale: list[Path]  # committed content differs from what generation produces
    missing: list[Path]  # generation produces it, the checkout lacks it
    unexpected: list[Path]  # in the generated package but not produced by generation

    def is_clean(self) -> bool:
        return not (self.stale or self.missing or self.unexpected)


def compare(fresh: Path, committed: Path) -> Drift:
    fresh_files, committed_files = _files(fresh), _files(committed)
    both = sorted(fresh_files & committed_files)
    return Drift(
        stale=[p for p in both if not filecmp.cmp(fresh / p, committed / p, shallow=False)],
        missing=sorted(fresh_files - committed_files),
        unexpected=sorted(committed_files - fresh_files),
    )


def check(layout: Layout) -> int:
    with tempfile.TemporaryDirectory(prefix="cellpilot-proto-") as tmp:
        fresh = generate_into(layout, Path(tmp))
        drift = compare(fresh, layout.api_dir)
    if drift.is_clean():
        print(f"generated code in {layout.api_dir.relative_to(layout.root)} is up to date")
        return 0
    shown = layout.api_dir.relative_to(layout.root)
    lines = ["generated code is stale:"]
    lines += [f"  stale:      {shown / p}" for p in drift.stale]
    lines += [f"  missing:    {shown / p}" for p in drift.missing]
    lines += [f"  unexpected: {shown / p}" for p in drift.unexpected]
    lines.append(REGENERATE_HINT)
    print("\n".join(lines), file=sys.stderr)
    return 1


def write(layout: Layout) -> int:
    with tempfile.TemporaryDirectory(prefix="cellpilot-proto-") as tmp:
        fresh = generate_into(layout, Path(tmp))
        drift = compare(fresh, layout.api_dir)
        for rel in drift.unexpected:
            (layout.api_dir / rel).unlink()
        for rel in drift.stale + drift.missing:
            target = layout.api_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fresh / rel, target)
    changed = len(drift.stale) + len(drift.missing) + len(drift.unexpected)
    print(
        f"generated {len(_files(layout.api_dir))} files in {layout.api_dir.relative_to(layout.root)} "
        f"({changed} changed, {len(drift.unexpected)} removed)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temporary directory and fail if the committed code differs",
    )
    parser.add_argument(
        "--root", type=Path, default=REPO_ROOT, help="repository root (default: this checkout)"
    )
    args = parser.parse_args(argv)
    layout = Layout(root=args.root.resolve())
    return check(layout) if args.check else write(layout)


if __name__ == "__main__":
    sys.exit(main())
