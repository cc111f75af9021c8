"""Evaluation reports: the markdown files in ``docs/results`` and ``summary.json`` of ``--out`` dirs."""

from __future__ import annotations

import json
from pathlib import Path

from markdown_it import MarkdownIt

from cellpilot_services.dashboard import models

IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
MAX_SUMMARIES = 200


class ReportLibrary:
    def __init__(self, results_dir: Path, out_dirs: list[Path]) -> None:
        self.results_dir = results_dir
        self.out_dirs = out_dirs
        # Raw HTML in a report is shown as text, never run (html=False).
        self.markdown = MarkdownIt("commonmark", {"html": False}).enable("table")

    def _sources(self) -> dict[str, tuple[str, Path]]:
        found: dict[str, tuple[str, Path]] = {}
        if self.results_dir.is_dir():
            for path in sorted(self.results_dir.glob("*.md")):
                found[path.stem] = ("markdown", path)
        for out_dir in self.out_dirs:
            for path in sorted(out_dir.glob("**/summary.json"))[:MAX_SUMMARIES]:
                relative = path.parent.relative_to(out_dir)
                parts = [out_dir.name, *relative.parts]
                found["summary-" + "-".join(p for p in parts if p)] = ("summary", path)
        return found

    def entries(self) -> models.ReportList:
        return models.ReportList(
            reports=[
                models.ReportEntry(name=name, kind=kind, source=str(path))  # type: ignore[arg-type]
                for name, (kind, path) in self._sources().items()
            ]
        )

    def report(self, name: str) -> models.Report | None:
        source = self._sources().get(name)
        if source is None:
            return None
        kind, path = source
        text = path.read_text(errors="replace")
        content = text if kind == "markdown" else json.loads(text)
        return models.Report(name=name, kind=kind, source=str(path), content=content)  # type: ignore[arg-type]

    def html(self, report: models.Report) -> str:
        if report.kind == "markdown":
            return str(self.markdown.render(str(report.content)))
        return ""

    def image(self, relative: str) -> tuple[Path, str] | None:
        """A figure a report links to, only from inside the results directory."""
        media_type = IMAGE_TYPES.get(Path(relative).suffix.lower())
        if media_type is None or not self.results_dir.is_dir():
            return None
        root = self.results_dir.resolve()
        path = (root / relative).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return None
        return path, media_type
