"""Debian's headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

Chromium reads protocol messages from fd 3 and writes to fd 4, each a JSON object ended by a
NUL byte; no websocket library is needed. Enough of the protocol for page tests: open a tab,
navigate and wait for the load event, evaluate JavaScript, take a full-page screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def chromium_binary() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class Chromium:
    def __init__(
        self,
        binary: str,
        profile_dir: Path,
        width: int = 1280,
        height: int = 1000,
        headers: dict[str, str] | None = None,
        accept_certificates_of_unknown_ca: bool = False,
    ) -> None:
        """``headers`` go with every request (a bearer token); the last flag lets the browser
        load HTTPS pages of a certificate signed by the stack's own CA."""
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def wire_fds() -> None:  # in the child: its fd 3 reads our commands, fd 4 carries answers
            command, answer = os.dup(to_browser_read), os.dup(from_browser_write)
            os.dup2(command, 3)
            os.dup2(answer, 4)

        self.process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile_dir}",
                f"--window-size={width},{height}",
                *(["--ignore-certificate-errors"] if accept_certificates_of_unknown_ca else []),
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire_fds,
            pass_fds=(3, 4),
            start_new_session=True,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, session=False
        )["sessionId"]
        self.call("Page.enable")
        if headers:
            self.call("Network.enable")
            self.call("Network.setExtraHTTPHeaders", {"headers": headers})
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], remaining)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise ConnectionError("Chromium closed the DevTools pipe")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return dict(json.loads(message))

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: bool = True, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        self._next_id += 1
        request: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            request["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    def wait_for_event(self, method: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def navigate(self, url: str, timeout_s: float = 30.0) -> None:
        self.events.clear()
        answer = self.call("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise RuntimeError(f"navigation to {url} failed: {answer['errorText']}")
        self.wait_for_event("Page.loadEventFired", timeout_s)

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def screenshot(self, path: Path) -> None:
        answer = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(answer["data"]))

    def close(self) -> None:
        with contextlib.suppress(OSError, TimeoutError, RuntimeError, ConnectionError):
            self.call("Browser.close", session=False, timeout_s=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        os.close(self._to_browser)
        os.close(self._from_browser)
