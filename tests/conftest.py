from __future__ import annotations

import json
import os
import re
import tokenize
from pathlib import Path
from typing import Any

import pytest

# The shared helpers' assertions (tests/support/: the HF check, the failing-rank check) report their
# values as a test module's do; before any test module imports them.
pytest.register_assert_rewrite("tests.support")

REFERENCE = Path(__file__).parent / "reference" / "hf_greedy.json"

# The servers the suite starts (`python -m engine serve`, `python app.py`) serve EngineConfig's
# eager defaults: dozens of replica starts would each pay the compile (engine/launch/served.py).
# tests/test_served_config.py starts one without it.
os.environ["SERVELAB_SERVE_EAGER"] = "1"
CHROMIUM = "/usr/bin/chromium"

# The suite's tiers. Each test module declares its own, `pytestmark = pytest.mark.unit` (or
# `integration`, `browser`; a list when it has other marks too), and `make test-fast` runs the first:
#   unit         no model, no server, no browser: fakes, the cost model and the virtual clock
#   integration  the real model, real replica processes or a real server
#   browser      a real Chromium page under Playwright
# A module that declares none, or more than one, fails collection: an undeclared module would
# otherwise drop out of `-m unit`, `-m integration` and `-m browser` without a word.
TIERS = ("unit", "integration", "browser")
# What a unit module must not name in its code (comments and strings are not read: prose may name
# anything). This is the static half of the unit tier's guard, and the only use of these patterns:
# they once assigned the tiers, so a comment could move a test. The runtime half is
# _unit_tests_load_no_model below: a unit test that reaches the real model fails when it runs.
BROWSER = re.compile(r"playwright")
INTEGRATION = re.compile(
    r"ServerProcess|running_lab|\bLLM\(|llm_fp32|hf_reference|build_lab|load_model|subprocess|Popen|multiprocessing"
    r"|serve_app|create_app|ProcessReplica|ReplicaHandle|\bFleet\(|LLMEngine\(EngineConfig\(|spawn"
    r"|default_gguf_path|check_platforms"
)
PROSE = {tokenize.COMMENT, tokenize.STRING} | ({tokenize.FSTRING_MIDDLE} if hasattr(tokenize, "FSTRING_MIDDLE") else set())


def code_of(path: Path) -> str:
    """The module's source with its comments and strings (docstrings too) blanked out."""
    source = path.read_text()
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    chars = list(source)
    with path.open("rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type in PROSE:
                a, b = starts[tok.start[0] - 1] + tok.start[1], starts[tok.end[0] - 1] + tok.end[1]
                chars[a:b] = [c if c == "\n" else " " for c in chars[a:b]]
    return "".join(chars)


def declared_tiers(module: Any) -> list[str]:
    marks = getattr(module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return [m.name for m in marks if getattr(m, "name", None) in TIERS]


class TieredModule(pytest.Module):
    """A test module that is collected only with exactly one tier declared, and, declared unit,
    only when its code names nothing of the other tiers."""

    def collect(self) -> Any:
        where = self.nodeid
        tiers = declared_tiers(self.obj)
        if len(tiers) != 1:
            raise self.CollectError(
                f"{where} declares {len(tiers)} tiers {tiers}: add exactly one of `pytestmark = pytest.mark.unit`,"
                " `pytest.mark.integration` or `pytest.mark.browser` (tests/conftest.py says what each means)"
            )
        if tiers == ["unit"]:
            code = code_of(self.path)
            named = sorted({m.group(0) for pattern in (INTEGRATION, BROWSER) for m in pattern.finditer(code)})
            if named:
                raise self.CollectError(
                    f"{where} is declared unit but its code names {named}: a unit test loads no model and starts"
                    " no server, process or browser; declare it integration (or browser), or use a fake"
                )
        return super().collect()


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.name.startswith("test_"):
        return TieredModule.from_parent(parent, path=module_path)
    return None


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
    """A fresh browser context and page per test (tests/support/browser_pages.py says what it collects)."""
    from tests.support.browser_pages import new_page

    context, page = new_page(browser)
    yield page
    context.close()


@pytest.fixture(autouse=True)
def _unit_tests_load_no_model(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Holds the unit tier to its word at run time: a unit test that reaches the real model fails,
    naming it (TieredModule checks the module's code when it is collected; this catches a helper
    that loads the model on a unit test's behalf)."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{request.node.nodeid} is in the unit tier but loads the model: tests/conftest.py")

    import engine.worker.live_executor

    monkeypatch.setattr(engine.worker.live_executor, "load_model", refuse)
