from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REFERENCE = Path(__file__).parent / "reference" / "hf_greedy.json"

# The servers the suite starts (`python -m engine serve`, `python app.py`) serve EngineConfig's
# eager defaults: dozens of replica starts would each pay the compile (engine/launch/served.py).
# tests/test_served_config.py starts one without it.
os.environ["SERVELAB_SERVE_EAGER"] = "1"
CHROMIUM = "/usr/bin/chromium"

# The suite's tiers, read from each module's source (`make test-fast` runs the first):
#   unit         no model, no server, no browser: fakes, the cost model and the virtual clock
#   integration  the real model, real replica processes or a real server (names one of INTEGRATION)
#   browser      a real Chromium page under Playwright
BROWSER = re.compile(r"playwright")
INTEGRATION = re.compile(
    r"ServerProcess|running_lab|\bLLM\(|llm_fp32|hf_reference|build_lab|load_model|subprocess|Popen|multiprocessing"
    r"|serve_app|create_app|ProcessReplica|ReplicaHandle|\bFleet\(|LLMEngine\(EngineConfig\(|spawn"
    r"|default_gguf_path|check_platforms"
)
TIERS = ("unit", "integration", "browser")


@cache
def tier_of(path: Path) -> str:
    source = path.read_text()
    if BROWSER.search(source):
        return "browser"
    return "integration" if INTEGRATION.search(source) else "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(Path(str(item.fspath)))))


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


@pytest.fixture(autouse=True)
def _unit_tests_load_no_model(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Holds the unit tier to its word: a unit test that reaches the real model fails, naming it."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{request.node.nodeid} is in the unit tier but loads the model: tests/conftest.py")

    import engine.live_executor

    monkeypatch.setattr(engine.live_executor, "load_model", refuse)
