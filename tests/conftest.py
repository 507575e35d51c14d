from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REFERENCE = Path(__file__).parent / "reference" / "hf_greedy.json"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def hf_reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="session")
def llm_fp32() -> Any:
    """One float32 engine with default levers, shared by tests that don't change levers."""
    from engine import LLM

    return LLM(dtype="float32")


@pytest.fixture(scope="module")
def browser() -> Any:
    """Debian's chromium under Playwright, one per browser-test module (each file skips itself
    when /usr/bin/chromium is missing)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Any:
    """A fresh browser context and page per test (tests/browser_pages.py says what it collects)."""
    from tests.browser_pages import new_page

    context, page = new_page(browser)
    yield page
    context.close()
