"""The repository stands on its own: its Markdown links resolve inside it and nothing cites
material outside it (papers are cited by name and section, see docs/bibliography.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|\b[Ii]ssue [0-9]+")


def tracked(pattern: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", pattern], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / name for name in out.split("\0") if name]


def relative_links(markdown: str) -> list[str]:
    """The link targets of a Markdown text that point into the repository (no URLs, no anchors)."""
    without_code = re.sub(r"```.*?```", "", markdown, flags=re.S)
    targets = [a or b for a, b in LINK.findall(without_code)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see [a](docs/a.md) and [b](https://x.org)", ["docs/a.md"]),
        ("![plot](fig.png) [top](#top) [m](mailto:x@y)", ["fig.png"]),
        ("```\n[not](a link)\n```\n[yes](b.md#part)", ["b.md#part"]),
    ],
    ids=["relative-and-url", "image-anchor-mailto", "code-fence-skipped"],
)
def test_relative_links_are_found(text: str, expected: list[str]) -> None:
    assert relative_links(text) == expected


def test_every_relative_markdown_link_resolves_inside_the_repository() -> None:
    broken = []
    for document in tracked("*.md"):
        for target in relative_links(document.read_text(encoding="utf-8")):
            path = (document.parent / target.split("#", 1)[0]).resolve()
            if not path.exists() or (ROOT not in path.parents and path != ROOT):
                broken.append(f"{document.relative_to(ROOT)}: {target}")
    assert not broken, "links that do not resolve inside the repository:\n" + "\n".join(broken)


def test_no_file_points_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    offenders = []
    for pattern in ("*.py", "*.md", "*.proto", "*.sql", "*.yml", "*.yaml", "*.toml", ".importlinter"):
        for path in tracked(pattern):
            if path.resolve() == this:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if OUTSIDE.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "cite papers by name and section, the design by docs/:\n" + "\n".join(offenders)
