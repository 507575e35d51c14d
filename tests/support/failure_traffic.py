"""Traffic for the failure rows' tests (issue 15, part B): submit to a live fleet, read each
request's outcome from its event queue, and check that a defence switched off and back on left no
KV blocks held and no replica process behind."""

from __future__ import annotations

import os
import queue
import time
import zlib
from dataclasses import dataclass

from engine.core.sequence import RequestTimes
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import RequestError, TokenDelta
from engine.serving.replicas.replica_process import replica_pids
from engine.serving.routing.router import AdmissionError
from engine.serving.scaling.fleet import Fleet
from tests.support.waiting import wait_for


@dataclass
class Outcome:
    request_id: str
    refused: str | None = None  # the AdmissionError's reason
    error: str | None = None  # a RequestError's message (deadline, failed replica)
    times: RequestTimes | None = None  # the server's timestamps, when it finished

    @property
    def ttft(self) -> float | None:
        return None if self.times is None else self.times.ttft


class Traffic:
    """Requests to one fleet: submit now, collect later (each has its own event queue)."""

    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.name = name
        self.pending: list[tuple[Outcome, queue.Queue | None]] = []
        self._collected = 0  # pending[:_collected] have their outcome already

    def submit(self, prompt: list[int], max_tokens: int) -> Outcome:
        outcome = Outcome(f"{self.name}-{len(self.pending)}")
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        try:
            events: queue.Queue | None = self.fleet.submit(outcome.request_id, prompt, params, None)
        except AdmissionError as err:
            outcome.refused, events = err.reason, None
        self.pending.append((outcome, events))
        return outcome

    def collect(self, timeout_s: float = 60.0) -> list[Outcome]:
        """Wait for every request submitted since the last collect; all the outcomes so far."""
        for outcome, events in self.pending[self._collected :]:
            while events is not None:
                event = events.get(timeout=timeout_s)
                if isinstance(event, RequestError):
                    outcome.error = event.message
                    break
                assert isinstance(event, TokenDelta)
                if event.finished:
                    outcome.times = event.times
                    break
        self._collected = len(self.pending)
        return [outcome for outcome, _ in self.pending]


def prompt(seed: int, length: int) -> list[int]:
    """Token ids no other test sends (so no prefix cache answers them), in the model's vocabulary."""
    return [1000 + (seed * 7919 + i * 104729) % 40000 for i in range(length)]


def seed_of(tag: str) -> int:
    """A prompt seed of its own for each phase of a test (stable across runs, unlike hash())."""
    return zlib.crc32(tag.encode()) % 30000


def ratio(a: float, b: float) -> float:
    return a / max(b, 1e-9)


def said(what: str, a: float, b: float, bound: str) -> str:
    """The message of a timing assertion: the ratio it checks, and the two times it measured (a
    busy machine slows both sides of a ratio; a failure says by how much it missed)."""
    return f"{what}: {a:.3f} s / {b:.3f} s = {ratio(a, b):.2f}x, expected {bound}"


def assert_idle_and_whole(fleet: Fleet, pids: list[int]) -> None:
    """Once every defence is back on and the traffic has gone: nothing queued or in flight, no KV
    block held on any replica, and the very same replica processes as before."""
    assert fleet.ready
    assert wait_for(
        lambda: (
            not len(fleet.router.queue)
            and all(r.num_in_flight == 0 and r.stats and r.stats.kv_used_blocks == 0 for r in fleet.replicas)
        ),
        timeout_s=30,
    ), [(r.num_in_flight, r.stats) for r in fleet.replicas]
    assert sorted(replica_pids(os.getpid())) == sorted(pids)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))
