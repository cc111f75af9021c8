"""Debian's headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

Chromium reads protocol messages from fd 3 and writes to fd 4, each a JSON object ended by a
NUL byte; no websocket library is needed. Enough of the protocol for page tests: open a tab,
navigate and wait for the load event, type into a field and click like a person (input
events), evaluate JavaScript, read the cookie jar, collect console errors (a Content-Security-
Policy refusal is one) and take a full-page screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def chromium_binary() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


WIRE_FDS_AND_EXEC = (
    "import os, sys; command, answer = int(sys.argv[1]), int(sys.argv[2]); "
    "os.dup2(command, 3); os.dup2(answer, 4); os.close(command); os.close(answer); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


def _above_4(fd: int) -> int:
    """The same file on a descriptor numbered 10 or more (never Chromium's 3 or 4)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


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
        to_browser_read, self._to_browser = (_above_4(fd) for fd in os.pipe())
        self._from_browser, from_browser_write = (_above_4(fd) for fd in os.pipe())
        # Chromium reads commands on its fd 3 and answers on fd 4: a small Python program moves the
        # child's pipe ends there and execs it (no preexec_fn; nothing assumed about our fds 3-4).
        command, answer = to_browser_read, from_browser_write
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WIRE_FDS_AND_EXEC,
                str(command),
                str(answer),
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
            pass_fds=(to_browser_read, from_browser_write),
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
        self.console: list[str] = []  # console errors and uncaught exceptions, in order
        self.call("Page.enable")
        self.call("Log.enable")
        self.call("Runtime.enable")
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
        answer = dict(json.loads(message))
        params = answer.get("params", {})
        if answer.get("method") == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.console.append(f"{params['entry'].get('source')}: {params['entry']['text']}")
        elif answer.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.console.append("console: " + " ".join(str(a.get("value", a)) for a in params["args"]))
        elif answer.get("method") == "Runtime.exceptionThrown":
            self.console.append(f"exception: {params['exceptionDetails'].get('text')}")
        return answer

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

    def wait_until(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Evaluate ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout_s} s: {expression}")
            time.sleep(0.2)

    def type_into(self, selector: str, text: str) -> None:
        """Focus the field and type ``text`` into it (input events, as a keyboard would)."""
        if not self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "if (!e) return false; e.focus(); return document.activeElement === e; })()"
        ):
            raise RuntimeError(f"no field {selector} to type into")
        self.call("Input.insertText", {"text": text})

    def click(self, selector: str, wait_for_load: bool = True, timeout_s: float = 30.0) -> None:
        """Press and release the mouse on the element's centre; by default wait for the page it loads."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if not box:
            raise RuntimeError(f"nothing to click at {selector}")
        self.events.clear()
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )
        if wait_for_load:
            self.wait_for_event("Page.loadEventFired", timeout_s)

    def cookies(self) -> list[dict[str, Any]]:
        """Every cookie the browser holds for the current page, with its flags."""
        return list(self.call("Network.getCookies")["cookies"])

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
