"""Browser-test fixtures: one `make run` server per session, Debian's Chromium through Playwright.

Nothing here skips: a server that does not come up or a browser that does not start fails
the tests (the CI must notice).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.browser.server import launch_chromium, streamlit_server

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "browser"


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def app_url(artifacts: Path) -> Iterator[str]:
    with streamlit_server(artifacts / "server.log") as url:
        yield url


@pytest.fixture(scope="session")
def chromium() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        yield browser
        browser.close()
