"""Polling for a condition that another thread or process makes true, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0, every_s: float = 0.02) -> bool:
    """True once condition() holds; False if timeout_s passes first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True
