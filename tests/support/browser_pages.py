"""A browser context and page for the Playwright tests, with what went wrong in it collected:
`page.errors` (console errors and uncaught exceptions), `page.uncaught` (the exceptions alone),
`page.dialogs` (alert/confirm texts, each dismissed: a dialog would hold the page)."""

from __future__ import annotations

from typing import Any

VIEWPORT = {"width": 1400, "height": 1000}


def new_page(browser: Any, width: int = VIEWPORT["width"], height: int = VIEWPORT["height"]) -> tuple[Any, Any]:
    """(context, page): close the context when done."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.errors, page.uncaught, page.dialogs = [], [], []
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: (page.errors.append(str(e)), page.uncaught.append(str(e))))
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    return context, page
