"""A simulated replica: the engine's own LLMEngine (Scheduler, BlockManager) in this process, its
runner the cost model, stepping on the event loop's VirtualClock.

It answers the router the way a ReplicaHandle does (state, stats from the latest step,
num_in_flight, submit, abort, drain), so the same Router dispatches to either kind. A step
begins (schedule), the cost model prices the batch, and the step ends that many virtual seconds
later (tokens appended, finished requests reported). No text and no per-token messages: a
request's stream gets one TokenDelta when it finishes (all its tokens and times) or an error.

Made by a fleet (engine/sim/fleet_run.py) it may start STARTING for `load_s` virtual seconds
(the model load) before it is READY, and reports to the metrics bus through `on_message` as a
live replica does: a StepMessage per step with its stats and the requests it finished."""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine.core.llm_engine import LLMEngine
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import FinishReason, Sequence
from engine.errors import InvalidParamError
from engine.serving.replicas.messages import AddRequest, RequestError, StepMessage, TokenDelta, expired_error
from engine.serving.replicas.replica_api import ENDED, ReplicaState, ReplicaStats
from engine.sim.loop import EventLoop
from engine.sim.runner import CostModelRunner

Finished = Callable[[Sequence], None]
LIVE = (ReplicaState.READY, ReplicaState.DRAINING)  # states that still step


class SimReplica:
    def __init__(
        self,
        replica_id: int,
        engine: LLMEngine,
        loop: EventLoop,
        on_finished: Finished,
        kv_transfer_s: Callable[[int], float] | None = None,
        load_s: float = 0.0,
        on_message: Callable[[StepMessage], None] | None = None,
        record_steps: bool = True,
    ) -> None:
        """kv_transfer_s: a disaggregated decode replica; a request arrives as prompt + its first
        token, and the prompt's KV takes kv_transfer_s(prompt tokens) to land before it can run.
        load_s: STARTING this long (loading the weights) before READY. on_message: the fleet's
        metrics bus, as a live replica's messages reach it (set later for a warm pool one).
        record_steps: keep the engine's StepRecords for the batch chart; a headless run (nobody
        draws them) leaves them out, a fifth of a big run's time."""
        assert isinstance(engine.runner, CostModelRunner)
        self.replica_id = replica_id
        engine.replica_id = replica_id  # its step records name it
        if not record_steps:
            engine.step_records = None
        self.engine = engine
        # Async output processing (engine/sim/host_profiles.py defers_outputs): a step's outputs are
        # processed while the next step runs and reach the client when it ends; _pending holds them.
        self.defer_outputs = False
        self._pending: tuple[float, list[tuple[Any, int, int, bool, bool]], list] | None = None
        self.config = engine.config
        self.runner: CostModelRunner = engine.runner
        self.loop = loop
        self.on_finished = on_finished
        self.kv_transfer_s = kv_transfer_s
        self.state = ReplicaState.READY
        self.error: str | None = None
        self.kv_usage_max = 0.0
        self.running_max = 0  # the most sequences running at once (a planner: were the slots ever full?)
        self.on_message = on_message
        self.tokens_out = 0  # tokens sampled, for a timeline's tokens/s
        self.created_at = loop.clock.now()
        self.ready_at: float | None = self.created_at if load_s <= 0 else None
        self._drain_on_load = False
        self._deltas: list[TokenDelta] = []  # finished this step, for on_message
        self._errors: list[RequestError] = []  # dropped at their deadline this step, for on_message
        self._streams: dict[str, queue.Queue] = {}
        self._busy = False
        self.stats: ReplicaStats | None = self._snapshot()
        if load_s > 0:
            self.state = ReplicaState.STARTING
            loop.after(load_s, self._loaded)

    def _loaded(self) -> None:
        if self.state != ReplicaState.STARTING:
            return  # stopped while loading
        self.state, self.ready_at = ReplicaState.READY, self.loop.clock.now()
        if self._drain_on_load:  # as a live replica: a drain sent while loading stops it once loaded
            self.state = ReplicaState.DRAINING
        self._publish(0)
        self._wake()

    # what the router sees ---------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A step is scheduled or running, or requests are still inside."""
        return self._busy or (self.state in LIVE and (self.engine.has_work() or bool(self._streams)))

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def _snapshot(self) -> ReplicaStats:
        """What a live replica reports with each step, read at the end of this one's."""
        e = self.engine
        return ReplicaStats(
            running=len(e.scheduler.running), waiting=len(e.scheduler.waiting), kv_used_blocks=e.kv.num_used_blocks,
            kv_total_blocks=e.kv.num_blocks, max_num_seqs=e.config.max_num_seqs,
            num_preemptions=e.scheduler.num_preemptions, spec_checks=e.speculation.checks,
            spec_draft_tokens=e.speculation.proposed, spec_accepted_tokens=e.speculation.accepted,
        )

    # commands ---------------------------------------------------------------------------------

    def submit(self, request: AddRequest, events: queue.Queue | None = None) -> queue.Queue:
        events = queue.Queue() if events is None else events
        if self.state != ReplicaState.READY:
            events.put(RequestError(request.request_id, None, f"replica {self.replica_id} is {self.state}"))
            return events
        self._streams[request.request_id] = events
        if self.kv_transfer_s is None:
            self._add(request)
        else:
            received = request.prompt_token_ids[:-1]  # the last id is the token the prefill replica sampled

            def land() -> None:
                if request.request_id in self._streams:  # not failed or stopped meanwhile
                    self.engine.kv.import_prefix(received)
                    self._add(request)

            self.loop.after(self.kv_transfer_s(len(received)), land)
        return events

    def _add(self, r: AddRequest) -> None:
        try:
            self.engine.add_request(
                r.request_id, None, r.params, prompt_token_ids=r.prompt_token_ids, arrival_time=r.arrival_time,
                deadline=r.deadline, drop_if_expired=r.drop_if_expired, priority=r.priority,
            )
        except InvalidParamError as err:
            self._streams.pop(r.request_id).put(RequestError(r.request_id, err.param, err.message))
            return
        self._wake()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake()

    def reconfigure(self, **changes: Any) -> None:
        self.engine.reconfigure(**changes)
        self.config = self.engine.config

    def drain(self) -> None:
        if self.state == ReplicaState.READY:
            self.state = ReplicaState.DRAINING
        self._drain_on_load = self.state == ReplicaState.STARTING
        self._wake()

    def stop(self) -> None:
        if self.state not in ENDED:  # a failed one stays failed
            self._end(ReplicaState.STOPPED, "replica stopped")

    def kill(self, reason: str) -> int:
        """Stopped at once (a scale-in without a drain): every request on it fails with `reason`.
        Returns how many of them had already produced a token (a live stream would be cut
        mid-sentence)."""
        cut = sum(
            1 for rid in self._streams if rid in self.engine.requests and self.engine.requests[rid].output_token_ids
        )
        if self.state not in ENDED:
            self._end(ReplicaState.STOPPED, reason)
        return cut

    def fail(self, reason: str) -> None:
        """A replica killed at a chosen time: its in-flight requests fail, its KV is gone."""
        self._end(ReplicaState.FAILED, reason)

    # stepping in virtual time -----------------------------------------------------------------

    def _wake(self) -> None:
        if not self._busy and self.state in LIVE:
            self._busy = True
            self.loop.at(self.loop.clock.now(), self._begin)

    def _begin(self) -> None:
        if self.state not in LIVE:
            self._busy = False
            return
        outputs, batch = self.engine.begin_step()
        self._report(outputs)
        self.running_max = max(self.running_max, len(self.engine.scheduler.running))
        if batch.empty:  # nothing can run until a request arrives or leaves
            self._flush()  # no next step to wait for: the last outputs go out as processed
            self._busy = False
            self.stats = self._snapshot()
            if self.state == ReplicaState.DRAINING and not self.engine.has_work():
                self.state = ReplicaState.STOPPED
            if self.on_message is not None:
                self._publish(0)
            return
        tokens = self.runner.execute(batch)
        self.loop.after(self.runner.last_cost.total_s, lambda: self._end_step(batch, tokens))

    def _end_step(self, batch: SchedulerOutput, tokens: dict[str, int]) -> None:
        if self.state not in LIVE:
            return  # failed mid-step: the step's results are lost with the replica
        kv = self.engine.kv
        self.kv_usage_max = max(self.kv_usage_max, kv.num_used_blocks / kv.num_blocks)
        outputs = self.engine.end_step(batch, tokens, stream=False)  # only the ended
        if self.defer_outputs:
            self._defer(batch, outputs)
        else:
            self._report(outputs)
        self.stats = self._snapshot()
        self.tokens_out += len(tokens) + batch.steady
        if self.on_message is not None:
            self._publish(len(batch.seqs) + batch.steady)
        self._begin()

    def _idle_share_now(self) -> list[float]:
        """Each pipeline stage's idle share, for its step's stats: none without stages."""
        return []

    def _publish(self, batch_size: int) -> None:
        """What a live replica's StepMessage carries: its stats and the requests it finished."""
        if self.on_message is None:
            return
        st = self.stats
        assert st is not None
        stats = replace(
            st, batch_size=batch_size, allreduce_ms_per_step=self.runner.last_cost.allreduce_s * 1000,
            # The running totals the failure gallery reads (engine/serving/telemetry/metrics.py COUNTERS).
            prefix_cache_queries=self.engine.kv.prefix_queries, prefix_cache_hits=self.engine.kv.prefix_hits,
            num_expired=self.engine.scheduler.num_expired,
            expired_prefill_tokens=self.engine.scheduler.expired_prefill_tokens,
            pp_stage_idle_share=self._idle_share_now(),
        )
        deltas, self._deltas = self._deltas, []
        errors, self._errors = self._errors, []
        steps = self.engine.step_records.take() if self.engine.step_records is not None else []
        self.on_message(StepMessage(self.replica_id, self.loop.clock.now(), deltas, errors, stats, self.state, steps))

    def _defer(self, batch: SchedulerOutput, outputs: list) -> None:
        """This step's outputs wait for the next step's end; the last step's go out now, their
        tokens (and first token, and end) moved from their step's end to this moment."""
        now = self.loop.clock.now()
        marks = []  # what this step stamped, found before the held step's are moved onto `now` too
        for seq in {id(s): s for s in (*batch.seqs, *(out.seq for out in outputs if out.seq is not None))}.values():
            times = seq.times
            tokens = times.tokens
            i = len(tokens)
            while i > 0 and tokens[i - 1] == now:
                i -= 1
            marks.append((times, i, len(tokens), times.first_token == now, times.finished == now))
        self._flush(now)
        self._pending = (now, marks, outputs)

    def _flush(self, now: float | None = None) -> None:
        """Deliver the held step's outputs, at `now` (None: at their own step's end)."""
        if self._pending is None:
            return
        stamped, marks, outputs = self._pending
        self._pending = None
        if now is not None and now != stamped:
            for times, begin, end, first, finished in marks:
                tokens = times.tokens
                for i in range(begin, min(end, len(tokens))):
                    if tokens[i] == stamped:
                        tokens[i] = now
                if first and times.first_token == stamped:
                    times.first_token = now
                if finished and times.finished == stamped:
                    times.finished = now
        self._report(outputs)

    def _report(self, outputs: list) -> None:
        for out in outputs:
            if out.finished and out.finish_reason == FinishReason.DEADLINE:  # as a live replica answers it
                if (expired := self._streams.pop(out.request_id, None)) is not None:
                    expired.put(expired_error(out.request_id))
                if self.on_message is not None:
                    self._errors.append(expired_error(out.request_id))
            elif out.finished:
                seq = out.seq
                events = self._streams.pop(out.request_id, None)
                if events is not None or self.on_message is not None:
                    delta = TokenDelta(
                        seq.request_id, seq.output_token_ids, "", True, seq.finish_reason, seq.num_prompt_tokens,
                        seq.num_cached_tokens, seq.times, first_token=True,  # one delta carries every token
                    )
                    if events is not None:
                        events.put(delta)
                    if self.on_message is not None:
                        self._deltas.append(delta)
                self.on_finished(seq)

    def _end(self, state: ReplicaState, reason: str) -> None:
        self._flush()  # what the last step finished was processed before the end
        self.state = state
        self._busy = False  # a step in flight ends with nothing (see _end_step)
        self.error = reason if state == ReplicaState.FAILED else None
        for request_id, events in self._streams.items():
            events.put(RequestError(request_id, None, reason))
        self._streams.clear()
        for seq in list(self.engine.requests.values()):
            self.engine.scheduler.remove(seq)  # the blocks go back: the replica's memory is gone
        self.engine.requests.clear()
        self.stats = self._snapshot()
