"""A real browser for the tests: Debian's headless Chromium driven by playwright (no browser download
of playwright's own). ``chromium()`` starts one browser (one per test module: playwright's sync API runs one
at a time in a thread); ``open_file(browser, path)`` loads a local page in a new tab and hands back the page
with every console message and every request it made; ``skip_reason()`` says why no browser can run here
(None when one can).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = "chromium"


def chromium_path() -> str | None:
    return shutil.which(CHROMIUM)


def skip_reason() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (make test installs it: requirements-test.txt)"
    if chromium_path() is None:
        return "Debian's chromium is not installed (make test installs it as root: tools/setup.sh --test)"
    return None


@dataclass
class Visit:
    page: object
    console: list[tuple[str, str]] = field(default_factory=list)
    """(type, text) of every console message: ``error``, ``warning``, ``log``..."""
    requests: list[str] = field(default_factory=list)
    """URL of every request the page made, the page's own first."""
    page_errors: list[str] = field(default_factory=list)
    """Uncaught exceptions of the page's scripts."""


TIMEOUT_MS = 30_000
"""Every wait of the browser: its start, a page load, a selector."""


@contextmanager
def chromium() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"], timeout=TIMEOUT_MS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def open_file(browser, path: Path, width: int = 1280, height: int = 900) -> Iterator[Visit]:
    page = browser.new_page(viewport={"width": width, "height": height})
    try:
        page.set_default_timeout(TIMEOUT_MS)
        visit = Visit(page)
        page.on("console", lambda m: visit.console.append((m.type, m.text)))
        page.on("request", lambda r: visit.requests.append(r.url))
        page.on("pageerror", lambda e: visit.page_errors.append(str(e)))
        page.goto(path.resolve().as_uri(), wait_until="load")
        yield visit
    finally:
        page.close()
