"""Watching replica processes from a test: one request's events to its end, whether a process is
gone, and the failing-rank check the tensor- and pipeline-parallel tests share."""

from __future__ import annotations

import os
import queue
import signal
import time
from typing import Any

from engine.config import EngineConfig
from engine.parallel.distributed import process_state
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import AddRequest, RequestError, TokenDelta
from engine.serving.replicas.replica import ReplicaHandle
from tests.support.waiting import wait_for


def collect(events: queue.Queue, timeout: float = 60.0) -> list[TokenDelta | RequestError]:
    got: list[TokenDelta | RequestError] = []
    while True:
        event = events.get(timeout=timeout)
        got.append(event)
        if isinstance(event, RequestError) or event.finished:
            return got


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting to be reaped."""
    return process_state(pid) in (None, "Z", "X")


def rank_fails_mid_stream(config: EngineConfig, how: int, named: str, hf_reference: dict[str, Any]) -> None:
    """Rank 1 of a two-rank replica stopped (or killed) mid-stream: the replica fails within 15 s,
    the stream ends with an in-band error naming the rank, a later request is refused, and no
    rank's process is left behind."""
    handle = ReplicaHandle(7, config)
    pids: list[int] = []
    try:
        assert handle.wait_ready(240), handle.error
        pids = handle.stats.rank_pids
        assert len(pids) == 2 and pids[0] == handle.process.pid
        prompt = hf_reference["prompts"][0]["prompt_ids"]
        events = handle.submit(AddRequest("doomed", prompt, SamplingParams(max_tokens=2000, ignore_eos=True)))
        assert isinstance(events.get(timeout=60), TokenDelta)
        os.kill(pids[1], how)
        stopped = time.monotonic()
        assert wait_for(lambda: handle.state == "failed", 15.0), f"{handle.state} 15 s after the rank stopped"
        took = time.monotonic() - stopped
        assert took < 15.0, f"the replica failed {took:.1f} s after its rank stopped: within 15 s"
        tail = collect(events, timeout=2.0)
        assert isinstance(tail[-1], RequestError) and named in tail[-1].message, tail[-1]
        print(f"failed after {time.monotonic() - stopped:.1f} s: {tail[-1].message}")
        late = handle.submit(AddRequest("after", [1, 2, 3], SamplingParams(max_tokens=2)))
        assert isinstance(late.get(timeout=1), RequestError)
        assert wait_for(lambda: all(gone(pid) for pid in pids), 5), [p for p in pids if not gone(p)]
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        handle.stop()
