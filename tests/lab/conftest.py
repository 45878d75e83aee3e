"""Fixtures of the browser tests (``labserver.py`` holds the parts)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from labserver import BUILT, CHROMIUM, CHROMIUM_FLAGS, Lab, Page


@pytest.fixture
def lab_factory(tmp_path: Path) -> Iterator[Callable[..., Lab]]:
    """Start ``Lab`` servers on this test's tmp dir; every one is stopped after the test."""
    if not BUILT.exists():
        pytest.skip(f"the JupyterLab extension is not built/linked ({BUILT}): run ./dev")
    started: list[Lab] = []

    def start(*extra: str, restart_of: Lab | None = None) -> Lab:
        server = Lab(tmp_path, *extra, restart_of=restart_of)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def lab(lab_factory: Callable[..., Lab]) -> Lab:
    return lab_factory()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (Playwright gives it a fresh temporary user-data-dir)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def new_page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Callable[[str], Page]]:
    """Open pages; when the test fails, each open page is screenshot as ``<prefix>-failure``."""
    pages: list[Page] = []

    def make(prefix: str) -> Page:
        page = Page(browser, prefix)
        pages.append(page)
        return page

    yield make
    if request.node.stash.get(_FAILED, False):
        for page in pages:
            if not page.page.is_closed():
                page.shot("failure")
