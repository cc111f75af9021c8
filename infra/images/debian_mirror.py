"""Print the Debian mirror URI and suite the host's apt already uses.

Reads /etc/apt/sources.list.d/*.sources (deb822) and /etc/apt/sources.list; the mirror is
never written into the repository, so each machine builds from the mirror it is set up for.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def find_mirror() -> tuple[str, str]:
    candidates: list[tuple[str, str]] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = {
                m.group(1).lower(): m.group(2).strip()
                for m in re.finditer(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.MULTILINE)
            }
            if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                for suite in fields.get("suites", "").split():
                    candidates.append((uri, suite))
    sources_list = Path("/etc/apt/sources.list")
    if sources_list.exists():
        for line in sources_list.read_text().splitlines():
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
            if m:
                candidates.append((m.group(1), m.group(2)))
    # The main archive: not the security or updates pockets.
    for uri, suite in candidates:
        if "security" not in uri and not re.search(r"-(updates|security|backports)$", suite):
            return uri, suite
    raise SystemExit("no Debian mirror found in the host's apt configuration")


if __name__ == "__main__":
    uri, suite = find_mirror()
    sys.stdout.write(f"{uri} {suite}\n")
