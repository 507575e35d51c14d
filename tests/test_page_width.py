"""Every page fits its window (issue 39, item 7): at a desktop window (1,400 x 900) and a phone's
(390 x 844), `python app.py`'s pages in Chromium under Playwright are no wider than the window. A
long line of code, a wide table or an unbroken word scrolls or wraps inside its own box instead of
widening the page. A failure names the page, the width and the element reaching furthest past the
window's right edge (one that no scrolling or clipping box around it holds in)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser_pages import new_page
from tests.support.server_process import ServerProcess, kv_budget_mb

CHROMIUM = "/usr/bin/chromium"
PAGES = ["/", *(f"/steps/{n}" for n in range(1, 9)), "/lab", "/failures", "/plan"]
WINDOWS = {"desktop": (1400, 900), "phone": (390, 844)}

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed"),
]

# The page's width against the window's and, only when it is wider, the element that reaches
# furthest past the right edge: the outermost one at that edge, skipping any that a box with its own
# overflow (a code block or table that scrolls, a clipped chart) holds in.
MEASURE = """() => {
  const doc = document.documentElement, W = window.innerWidth;
  const result = { scrollWidth: doc.scrollWidth, innerWidth: W, offender: null };
  if (doc.scrollWidth <= W + 1) return result;
  const heldIn = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") return true;
    }
    return false;
  };
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
    + (typeof el.className === "string" && el.className.trim() ? "." + el.className.trim().split(/\\s+/).join(".") : "");
  const path = (el) => {
    const names = [];
    for (let a = el; a && a !== document.body && names.length < 4; a = a.parentElement) names.unshift(name(a));
    return names.join(" > ");
  };
  const reaching = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.right > W + 1 && (r.width > 0 || r.height > 0) && !heldIn(el)) reaching.push([el, r.right]);
  }
  if (reaching.length) {
    const right = Math.max(...reaching.map(([, r]) => r));
    const atEdge = reaching.filter(([, r]) => r >= right - 0.5).map(([el]) => el);
    const [outer, inner] = [atEdge[0], atEdge.filter((el) => atEdge[0].contains(el)).pop()];
    result.offender = path(outer) + " (right edge at " + Math.round(right) + " px): "
      + JSON.stringify((outer.textContent || "").trim().replace(/\\s+/g, " ").slice(0, 80))
      + (inner !== outer ? "; innermost at that edge: " + path(inner) : "");
  }
  return result;
}"""


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--kv-budget-mb", kv_budget_mb(64), "--max-num-seqs", "16", command=("app.py",))
    yield proc
    proc.stop()


@pytest.mark.parametrize("window", list(WINDOWS))
def test_every_page_fits_its_window(server: ServerProcess, browser: Any, window: str) -> None:
    width, height = WINDOWS[window]
    context, page = new_page(browser, width, height)
    too_wide = []
    try:
        for path in PAGES:
            response = page.goto(f"{server.base_url}{path}", wait_until="load")
            assert response is not None and response.ok, f"{path}: HTTP {response and response.status}"
            # A live page fills its panels, timeline and charts from the first snapshot on.
            page.wait_for_function("() => !window.servelab || window.servelab.snapshots > 0", timeout=30_000)
            page.evaluate("() => document.fonts.ready")
            m = page.evaluate(MEASURE)
            if m["scrollWidth"] > m["innerWidth"] + 1:
                too_wide.append(
                    f"{path} at {width} px is {m['scrollWidth']} px wide (window {m['innerWidth']} px); "
                    f"widest: {m['offender'] or 'no element found past the edge'}"
                )
    finally:
        context.close()
    assert not too_wide, "\n".join(too_wide)
