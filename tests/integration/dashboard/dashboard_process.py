"""A dashboard process for tests, and what its browser tests share.

``DashboardProcess`` runs ``python -m cellpilot_services.dashboard`` over HTTPS with the stack's
certificates (and its Redis, where sign-in links are recorded) on a port of its own; it can be
restarted on the same port. ``http_session`` is a cookie-keeping HTTPS client that trusts the
stack's CA, like a browser that imported it.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

from cell_processes import Process
from stack_security import https_context, security

from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
CHROMIUM_MISSING = ARTIFACTS / "chromium-missing.txt"


def chromium_missing_reason() -> str:
    """Why there is no Chromium: the line `make test` wrote when it could not install it."""
    if CHROMIUM_MISSING.exists():
        return CHROMIUM_MISSING.read_text().strip()
    return "Chromium is not installed: `make test` (or `make browser`) installs it with the package manager"


class DashboardProcess:
    def __init__(self, endpoints: StackEndpoints, log_dir: Path, env: dict[str, str]) -> None:
        self.endpoints = endpoints
        self.log_dir = log_dir
        self.port = free_port()
        self.env = {"CELLPILOT_DASHBOARD_PORT": str(self.port), **env}
        self.url = f"https://127.0.0.1:{self.port}"
        self.process = self._start()

    def _start(self) -> Process:
        process = Process("dashboard", self.env, self.log_dir, self.endpoints)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=2, context=https_context()).close()
                return process
            except OSError:
                if process.process.poll() is not None or time.monotonic() > deadline:
                    process.stop()
                    raise AssertionError(f"the dashboard did not start:\n{process.log_tail()}") from None
                time.sleep(0.3)

    def restart(self) -> None:
        self.process.stop()
        self.process = self._start()

    def stop(self) -> None:
        self.process.stop()


def http_session() -> requests.Session:
    http = requests.Session()
    http.trust_env = False  # REQUESTS_CA_BUNDLE would replace the stack's CA
    http.verify = str(security().certs_dir / "ca.crt")
    return http
