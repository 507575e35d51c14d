"""Multi-step scheduling's delivery (EngineConfig.scheduler_steps, vLLM 0.6's
--num-scheduler-steps): the scheduler runs a decode batch several steps per schedule, and the
engine holds the run's outputs until its last step, when every token it made (and every request
it ended) is stamped with that moment: they reach the client together, as vLLM 0.6's multi-step
ITL shows (ten tokens at once). vLLM's llm_engine.step appends a run's outputs only once no steps
remain."""

from __future__ import annotations

from typing import Generic, TypeVar

from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus

Output = TypeVar("Output")  # the engine's RequestOutput (engine/core/request_output.py)


class HeldRun(Generic[Output]):
    def __init__(self) -> None:
        self.run_id: int | None = None  # the scheduler's number of the run in progress
        self.members: list[tuple[Sequence, int]] = []  # each with its token count when the run began
        self.held: list[Output] = []

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def after_schedule(self, sched: Scheduler, now: float) -> list[Output]:
        """A run the scheduler ended early is delivered now; a run it began is noted."""
        delivered = []
        if self.active and (not sched.in_run or sched.runs_started != self.run_id):
            delivered = self.deliver(now)
        if sched.in_run and not self.active:
            self.run_id, self.members = sched.runs_started, [(seq, len(seq.times.tokens)) for seq in sched.run_seqs]
        return delivered

    def hold(self, outputs: list[Output], sched: Scheduler, now: float) -> list[Output]:
        """A step of the run ended: its outputs wait for the run's last step (or for every member
        to finish), then all of them go out."""
        self.held += outputs
        running = SequenceStatus.RUNNING
        if sched.run_steps_left > 0 and any(seq.status is running for seq, _ in self.members):
            return []
        return self.deliver(now)

    def deliver(self, now: float) -> list[Output]:
        for seq, first in self.members:
            tokens = seq.times.tokens
            tokens[first:] = [now] * (len(tokens) - first)
            if seq.times.finished is not None:
                seq.times.finished = now
        held = self.held
        self.run_id, self.members, self.held = None, [], []
        return held
