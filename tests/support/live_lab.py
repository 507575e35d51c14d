"""A live lab on the real model for a test module: built from levers, ready, stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app import build_lab
from engine.lab.live.lab import LiveLab
from tests.support.waiting import wait_for


@contextmanager
def running_lab(levers: dict[str, Any]) -> Iterator[LiveLab]:
    """The lab at these levers (float32, so every CPU class runs the same numbers), once a
    replica serves; stopped, replicas and all, on the way out."""
    lab = build_lab(levers, engine={"dtype": "float32"}, drain_timeout_s=3.0)
    try:
        assert wait_for(lambda: lab.fleet.ready, 240), [r.error for r in lab.fleet.replicas]
        yield lab
    finally:
        lab.stop()
        lab.fleet.stop()


def finished(lab: LiveLab) -> int:
    """Requests the lab's fleet has finished (its metrics bus's e2e count)."""
    return lab.fleet.bus.histograms["e2e_request_latency_seconds"].count
