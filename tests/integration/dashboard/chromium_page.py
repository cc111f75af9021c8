"""The system's Chromium (what ``make browser`` installs), driven by Playwright for the
dashboard's page tests.

Playwright launches the browser found on PATH (``executable_path``): it downloads no browser of
its own. The page trusts the stack's own CA the way a person who accepted its certificate does,
and keeps every console error and uncaught exception (a Content-Security-Policy refusal is one).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from playwright.sync_api import ConsoleMessage, Page, sync_playwright

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def chromium_binary() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


@dataclass
class BrowserPage:
    page: Page
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions, in order

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")


@contextmanager
def chromium_page(binary: str, width: int = 1280, height: int = 1000) -> Iterator[BrowserPage]:
    """A headless page of the Chromium at ``binary``, in a profile of its own."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=binary, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        try:
            context = browser.new_context(
                ignore_https_errors=True, viewport={"width": width, "height": height}
            )
            opened = BrowserPage(context.new_page())
            opened.page.on("console", opened._console)
            opened.page.on("pageerror", lambda error: opened.errors.append(f"exception: {error}"))
            yield opened
        finally:
            browser.close()
