"""Driving the app's pages in a real browser (Playwright over Debian's chromium): as the
instructor, reading and moving the lab's levers, answering a card's prediction."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.support.server_process import ROOT, ServerProcess

CHROMIUM = "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed")
TOKEN = "teacher-secret"  # the instructor's (SERVELAB_INSTRUCTOR_TOKEN of the server under test)
ARTIFACTS = ROOT / "tests" / "artifacts"


def screenshot(page: Page, name: str) -> None:
    """A picture for a person, taken mid-flood: a page whose machine is busy with the flood may
    not settle for a full-page capture in time, and a missing picture fails no behaviour."""
    try:
        page.screenshot(path=str(ARTIFACTS / name), full_page=True, timeout=15_000)
    except PlaywrightTimeout:
        print(f"screenshot {name}: the page did not settle in 15 s (skipped)")


def open_as_instructor(page: Page, server: ServerProcess, path: str) -> None:
    page.goto(f"{server.base_url}{path}?token={TOKEN}")
    page.wait_for_function("window.servelab && window.servelab.role === 'instructor' && window.servelab.snapshots > 0")


def lab_value(page: Page, key: str) -> object:
    return page.evaluate(f"window.servelab.lab.levers[{key!r}]")


def wait_for(page: Page, expression: str, timeout_s: float = 60) -> None:
    page.wait_for_function(expression, timeout=timeout_s * 1000)


def collect_events(page: Page) -> None:
    page.evaluate(
        "window.servelab.events = []; window.servelab.socket.on('event', e => window.servelab.events.push(e))"
    )


def set_levers(page: Page, levers: str) -> None:
    ack = page.evaluate(f"new Promise(r => window.servelab.socket.emit('set_levers', {levers}, r))")
    assert ack["ok"], ack


def predict_first_card(page: Page, guess: str) -> None:
    """Open the page's first 'Try these' card, type the number it asks for, and see what to watch."""
    page.click("[data-kind=scenarios][data-scenario='0']")
    box = page.locator(".predict-box")
    expect(box.locator(".predict-question")).to_contain_text("Predict first:")
    box.locator(".predict-number input").fill(guess)
    box.locator(".predict-number button").click()
    expect(page.locator("#scenario-result")).to_contain_text("Watch:")
