"""A simulated replica whose layers are split into pipeline stages (SimSpec.pp).

A batch goes through the stages in turn: stage s starts it once the previous stage has handed
over its activations and stage s itself is free, and its tokens land when the last stage ends
(the first stage schedules, the last samples: the cost model's stages). With overlap on, the
scheduler forms a new batch as soon as the first stage is free, up to as many batches in flight
as there are stages (vLLM's batch queue, `max_concurrent_batches = pp`), so the stages work on
different batches at once; a sequence in flight is not scheduled again until its batch lands,
because its next token depends on it. With overlap off, one batch at a time: every stage idles
while the others work, the bubble the lesson shows.

`stage_busy_s` keeps each stage's busy time: 1 - busy / elapsed is its idle share (the bubble)."""

from __future__ import annotations

from engine.core.scheduler import SchedulerOutput
from engine.parallel.stage_clock import StageClock
from engine.serving.replicas.replica_api import ReplicaState
from engine.sim.cost_model import StepCost
from engine.sim.replica import LIVE, SimReplica


class PipelinedSimReplica(SimReplica):
    def __init__(self, *args: object, stages: int, overlap: bool = True, **kwargs: object) -> None:
        self.max_batches = stages if overlap else 1
        self.stage_busy_s = [0.0] * stages
        self.stage_clocks = [StageClock() for _ in range(stages)]  # the lab's windowed bubble
        self._in_flight = 0  # batches inside the pipeline
        self._begin_pending = False
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # When each stage finishes the work it has been given.
        self._stage_free = [self.loop.clock.now()] * stages

    @property
    def busy(self) -> bool:
        return self._in_flight > 0 or self._begin_pending or super().busy

    def _wake(self) -> None:
        if self.state in LIVE:
            self._begin_soon()

    def _begin_soon(self) -> None:
        """A _begin when the first stage is next free (at most one is pending)."""
        if not self._begin_pending:
            self._begin_pending = True
            self.loop.at(max(self.loop.clock.now(), self._stage_free[0]), self._begin)

    def _begin(self) -> None:
        self._begin_pending = False
        if self.state not in LIVE or self._in_flight >= self.max_batches:
            return  # a landing batch begins the next
        now = self.loop.clock.now()
        # The running sequences split evenly over the batches in flight (those in one are skipped).
        share = -(-len(self.engine.scheduler.running) // self.max_batches)
        outputs, batch = self.engine.begin_step(max_continuing=max(1, share))
        self._report(outputs)
        self.running_max = max(self.running_max, len(self.engine.scheduler.running))
        if not batch.seqs:  # nothing to start: a landing batch or a new request wakes it
            if not self._in_flight:
                self.stats = self._snapshot()
                if self.state == ReplicaState.DRAINING and not self.engine.has_work():
                    self.state = ReplicaState.STOPPED
                self._publish(0)
            return
        for seq in batch.seqs:
            seq.in_flight = True
        tokens = self.runner.execute(batch)
        spans, host_s = self._through_stages(now, self.runner.last_stages), self.runner.last_cost.host_s
        self._in_flight += 1
        landing = spans[-1][1] + self.runner.last_stages[-1].transfer_s
        self.loop.at(landing, lambda: self._land(batch, tokens, now, spans, host_s))
        if self._in_flight < self.max_batches:
            self._begin_soon()

    def _through_stages(self, start: float, costs: list[StepCost]) -> tuple[tuple[float, float], ...]:
        """Books the batch on each stage in turn; each stage's (start, end) on it."""
        ready, spans = start, []
        for s, cost in enumerate(costs):
            begins = max(ready, self._stage_free[s])
            self._stage_free[s] = begins + cost.compute_s
            self.stage_busy_s[s] += cost.compute_s
            spans.append((begins, self._stage_free[s]))
            ready = self._stage_free[s] + cost.transfer_s  # the activations reach the next stage
        return tuple(spans)

    def _land(
        self,
        batch: SchedulerOutput,
        tokens: dict[str, int],
        started: float,
        spans: tuple[tuple[float, float], ...],
        host_s: float,
    ) -> None:
        self._in_flight -= 1
        for clock, (start, end) in zip(self.stage_clocks, spans):
            clock.record(start, end)
        for seq in batch.seqs:
            seq.in_flight = False
        if self.state not in LIVE:
            return  # failed mid-step: the step's results are lost with the replica
        # A sequence aborted, or its replica's requests dropped, while its batch was in a stage.
        kept = batch
        if any(self.engine.requests.get(seq.request_id) is not seq for seq in batch.seqs):
            kept = SchedulerOutput(preempted=batch.preempted)
            for seq, n in zip(batch.seqs, batch.num_new_tokens):
                if self.engine.requests.get(seq.request_id) is seq:
                    kept.add(seq, n)
        kv = self.engine.kv
        self.kv_usage_max = max(self.kv_usage_max, kv.num_used_blocks / kv.num_blocks)
        # The batch's span is its own: the runner's last_model_s may be a later batch's by now.
        model_s = self.loop.clock.now() - started - host_s
        self._report(self.engine.end_step(kept, tokens, stream=False, started=started, stages=spans, model_s=model_s))
        self.stats = self._snapshot()
        self.tokens_out += sum(1 for seq in kept.seqs if seq.request_id in tokens)
        self._publish(len(kept.seqs))
        self._begin_soon()

    def _idle_share_now(self) -> list[float]:
        now = self.loop.clock.now()
        return [clock.idle_share(now) for clock in self.stage_clocks]

    def stage_idle_share(self, elapsed_s: float) -> list[float]:
        """Each stage's idle share of elapsed_s (the bubble, where the pipeline is not full)."""
        return [max(0.0, 1 - busy / elapsed_s) if elapsed_s > 0 else 0.0 for busy in self.stage_busy_s]
