"""One replica's engine: add requests, step (schedule -> run -> postprocess), abort, report stats.

while engine.has_work():
    for out in engine.step():   # every request's new tokens from this step
        ...
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from engine.clock import WALL_CLOCK, Clock
from engine.config import IN_PLACE_FIELDS, EngineConfig
from engine.core.block_manager import BlockManager, blocks_for
from engine.core.contiguous_allocator import ContiguousAllocator
from engine.core.detokenizer import text_step
from engine.core.engine_stats import EngineStats, field_values
from engine.core.multi_step import HeldRun
from engine.core.prompt_ids import PromptIds, checked_prompt_ids
from engine.core.request_output import RequestOutput
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import FinishReason, RequestTimes, Sequence, SequenceStatus
from engine.core.static_scheduler import StaticScheduler
from engine.core.steady_decodes import SteadyDecodes
from engine.core.step_record import StepRing, step_record
from engine.errors import InvalidParamError
from engine.parallel.ranks import tp_stats
from engine.platform import machine
from engine.sample.spec_decode import Speculation
from engine.sampling_params import SamplingParams
from engine.worker.executor import Executor

if TYPE_CHECKING:  # the live executor's types: torch is loaded only when an engine loads a model
    from engine.model.llama import Llama
    from engine.parallel.distributed import ShardGroup

log = logging.getLogger("servelab.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig, clock: Clock = WALL_CLOCK, executor: Executor | None = None) -> None:
        """executor: what the engine runs on; None loads the model named by config (live)."""
        self.config = config
        self.clock = clock
        self.model: Llama | None = None  # the live executor's weights
        self.plan: machine.EnginePlan | None = None  # what the live engine runs here, and why
        self.shard_group: ShardGroup | None = None
        if executor is None:
            executor = self._load_live(config)
        self.executor = executor
        self.memory = executor.memory
        self.tokenizer = executor.tokenizer
        self.model_cfg = executor.model_cfg
        self.runner = executor.runner
        self.max_model_len = min(config.max_model_len or self.model_cfg.max_position, self.model_cfg.max_position)
        eos = self.model_cfg.eos_token_ids or (self.tokenizer.eos_token_ids if self.tokenizer else [])
        self.eos_token_ids = set(eos)
        num_blocks = self.memory.num_blocks
        if config.paged:
            self.kv: BlockManager | ContiguousAllocator = BlockManager(
                num_blocks, config.block_size, config.prefix_caching
            )
            self.scheduler: Scheduler = Scheduler(config, self.kv, clock)  # type: ignore[arg-type]
        else:
            self.kv = ContiguousAllocator(num_blocks, config.block_size)
            self.scheduler = StaticScheduler(config, self.kv, clock)  # type: ignore[arg-type]
        self.requests: dict[str, Sequence] = {}
        self._to_abort: set[str] = set()
        self.num_steps = 0
        self.speculation = Speculation(proposer=executor.proposer)  # EngineConfig.num_speculative_tokens
        self.last_batch = SchedulerOutput()  # what the latest step ran, for stats and benchmarks
        self.replica_id = 0  # which replica this engine is, for its step records
        self.step_records: StepRing | None = StepRing()  # the latest steps; None: a headless simulation
        self._step_started = 0.0
        # Pipelined with overlap: the batches inside the stages, oldest first (batch, launch, began).
        self._in_flight: deque[tuple[SchedulerOutput, Any, float]] = deque()
        # Multi-step scheduling (config.scheduler_steps): the run in progress, its outputs held.
        self._run: HeldRun[RequestOutput] = HeldRun()

    def _load_live(self, config: EngineConfig) -> Executor:
        """Load the weights and tokenizer, shard them, plan the KV budget, build the runner."""
        from engine.worker.live_executor import load_live  # torch: only a live engine loads it

        live = load_live(config)
        self.config, self.model, self.plan, self.shard_group = live.config, live.model, live.plan, live.shard_group
        self.dtype = live.dtype
        return live.executor

    # requests ---------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | None = None,
        params: SamplingParams | None = None,
        prompt_token_ids: PromptIds | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        deadline: float | None = None,
        drop_if_expired: bool = True,
    ) -> Sequence:
        """Validate and queue a request; bad input raises InvalidParamError naming the field.
        deadline: the router's (clock time); drop_if_expired: the scheduler drops the request
        unstarted once it has passed, else it is prefilled anyway and its tokens counted."""
        params = params or SamplingParams()
        params.validate()
        if request_id in self.requests:
            raise InvalidParamError("request_id", f"request {request_id!r} is already running")
        if prompt_token_ids is None:
            if not isinstance(prompt, str):
                raise InvalidParamError("prompt", "must be a string or a list of token ids")
            if self.tokenizer is None:
                raise InvalidParamError("prompt", "this engine has no tokenizer: send prompt_token_ids")
            prompt_token_ids = self.tokenizer.encode(prompt)
        if not prompt_token_ids:
            raise InvalidParamError("prompt", "must not be empty")
        ids = checked_prompt_ids(prompt_token_ids, self.model_cfg.vocab_size)
        if len(ids) >= self.max_model_len:
            raise InvalidParamError("prompt", f"{len(ids)} tokens; the context holds {self.max_model_len}")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise InvalidParamError(
                "max_tokens",
                f"prompt ({len(ids)}) + max_tokens ({params.max_tokens}) exceeds the context of {self.max_model_len} tokens",
            )
        if blocks_for(len(ids) + params.max_tokens, self.config.block_size) > self.kv.num_blocks:
            raise InvalidParamError(
                "max_tokens",
                f"prompt + max_tokens needs more KV memory than this replica has "
                f"({self.kv.num_blocks * self.config.block_size} tokens)",
            )
        now = self.clock.now()
        seq = Sequence(
            request_id, ids, params, RequestTimes(arrival=arrival_time if arrival_time is not None else now), priority
        )
        seq.deadline, seq.drop_if_expired = deadline, drop_if_expired
        seq.max_output = min(params.max_tokens, self.max_model_len - len(ids))
        seq.stop_ids = frozenset(params.stop_token_ids).union(() if params.ignore_eos else self.eos_token_ids)
        seq.has_stop_strings = bool(params.stop)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> None:
        """Drop the request at the next step; its blocks are freed then."""
        if request_id in self.requests:
            self._to_abort.add(request_id)

    def has_work(self) -> bool:
        return bool(self.requests)

    # the loop ---------------------------------------------------------------------------------

    def step(self, stream: bool = True) -> list[RequestOutput]:
        """stream=False: outputs only for requests that ended (a caller that reads the Sequence
        at the end, as LLM.generate and the what-if replica do); the decisions are the same."""
        if self.shard_group is not None and self.config.pipeline_parallel > 1 and self.config.pipeline_overlap:
            return self._step_overlapped(stream)
        outputs, batch = self.begin_step()
        if batch.seqs:
            tokens = self.runner.execute(batch)
            outputs += self.end_step(batch, tokens, stream, stages=self._landed_stages())
        return outputs

    def _landed_stages(self) -> tuple[tuple[float, float], ...]:
        """Each pipeline stage's (start, end) on the batch that just came back; () without stages."""
        group = self.shard_group
        return group.landed_stages() if group is not None and group.pp > 1 else ()

    def _step_overlapped(self, stream: bool) -> list[RequestOutput]:
        """Pipeline stages at work at once: a new batch forms whenever the first stage is free and
        fewer than pipeline_parallel batches are in flight (the running split evenly over them); the
        oldest lands when the pipeline is full or nothing else can start. A sequence in flight is
        not scheduled again until its batch lands: its next token depends on it."""
        outputs: list[RequestOutput] = []
        limit = self.config.pipeline_parallel
        if len(self._in_flight) < limit:
            share = -(-len(self.scheduler.running) // limit)
            outputs, batch = self.begin_step(max(1, share))
            if batch.seqs:
                for seq in batch.seqs:
                    seq.in_flight = True
                self._in_flight.append((batch, self.runner.launch(batch), self._step_started))
                if len(self._in_flight) < limit:
                    return outputs
        if self._in_flight:
            batch, launched, started = self._in_flight.popleft()
            tokens = self.runner.collect(launched)
            for seq in batch.seqs:
                seq.in_flight = False
            outputs += self.end_step(batch, tokens, stream, started, self._landed_stages())
        return outputs

    def begin_step(self, max_continuing: int | None = None) -> tuple[list[RequestOutput], SchedulerOutput]:
        """Drop aborted requests and schedule (Scheduler.schedule's max_continuing); the what-if
        replica runs the batch in virtual time and calls end_step when the cost model says it is over."""
        self._step_started = self.clock.now()  # the step's host time begins with its scheduling
        outputs = self._drop_aborted()
        batch = self.scheduler.schedule(max_continuing)
        now = self.clock.now()
        for seq in batch.expired:  # never started: no blocks to free, nothing generated
            self._finish(seq, FinishReason.DEADLINE, now)
            outputs.append(RequestOutput(seq.request_id, [], "", True, FinishReason.DEADLINE, seq))
        if self.config.scheduler_steps > 1:
            outputs += self._run.after_schedule(self.scheduler, now)
        self.last_batch = batch
        return outputs, batch

    def end_step(
        self,
        batch: SchedulerOutput,
        new_tokens: dict[str, int],
        stream: bool = True,
        started: float | None = None,
        stages: tuple[tuple[float, float], ...] = (),
        model_s: float | None = None,
    ) -> list[RequestOutput]:
        """started: when this batch began, where batches overlap (a pipelined replica's stages);
        otherwise the latest begin_step's. stages: each pipeline stage's (start, end) on it.
        model_s: the model's part of the step, where the runner's latest (last_model_s) is another
        batch's (a simulated pipeline's); the executor measures it, this layer reads no wall time."""
        self.num_steps += 1
        cfg, records, record = self.config, self.step_records, None  # read the batch before _postprocess moves it on
        if records is not None:
            began = self._step_started if started is None else started
            record = step_record(batch, self.replica_id, began, began, cfg.max_batched_tokens, cfg.max_num_seqs, stages)
        model = self.runner.last_model_s if model_s is None else model_s
        outputs = self._postprocess(batch, new_tokens, stream)
        if cfg.num_speculative_tokens:  # the next step's guesses (host work: counted in the step)
            self.speculation.guess(self.scheduler.running, cfg, self.max_model_len)
        now = self.clock.now()  # after the outputs: processing them is the step's host time too
        if records is not None and record is not None:
            records.append(record.ended(now, model))
        return self._run.hold(outputs, self.scheduler, now) if self._run.active else outputs

    def _postprocess(
        self, batch: SchedulerOutput, new_tokens: dict[str, int | list[int]], stream: bool
    ) -> list[RequestOutput]:
        now = self.clock.now()  # one reading for every token of the step: they land together
        outputs = []
        publish = self.kv.cache_full_blocks if self.kv.enable_prefix_caching else None
        text = self.tokenizer is not None  # the what-if engine has no text to make
        # Locals for the loop below: a big what-if step runs it for a thousand sequences.
        token_of, emit_one, stop, length = new_tokens.get, self._emit, FinishReason.STOP, FinishReason.LENGTH
        emit_all = stream or text  # else only a token that ends its request, or may (stop strings), is emitted
        steady = self.scheduler.steady
        held: list[tuple[Sequence, int, FinishReason | None]] | None = [] if steady is not None else None
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            token = token_of(seq.request_id)
            if token.__class__ is list:  # a speculating decode: its accepted guesses, then a token
                if (out := self._land_guesses(seq, token, now, stream)) is not None:  # type: ignore[arg-type]
                    outputs.append(out)
                continue
            seq.num_computed_tokens += n
            if publish is not None:
                publish(seq)
            if token is None:
                continue
            output_ids = seq.output_token_ids
            output_ids.append(token)
            times = seq.times
            if times.first_token is None:
                times.first_token = now
            times.tokens.append(now)
            # sequence.stop_reason inline (the hottest loop of a what-if run): stop ids, then length.
            reason = stop if token in seq.stop_ids else length if len(output_ids) >= seq.max_output else None
            # Most tokens of a run nobody streams end nothing and make no text: nothing to do.
            if not (reason or emit_all or seq.has_stop_strings):
                continue
            if held is not None:  # emitted below, in running order with the steady decodes that ended
                held.append((seq, token, reason))  # type: ignore[arg-type]
            elif (out := emit_one(seq, [token], reason, now, stream)) is not None:  # type: ignore[list-item]
                outputs.append(out)
        if steady is not None and held is not None:
            outputs += self._land_steady(steady, batch, held, now, stream)
        return outputs

    def _land_steady(
        self, steady: SteadyDecodes, batch: SchedulerOutput, held: list[tuple[Sequence, int, FinishReason | None]],
        now: float, stream: bool,
    ) -> list[RequestOutput]:
        """The steady decodes' step landed: those it ended are emitted with the batch's, in the
        running order the loop above would have met them in; the batch's new decodes join."""
        if batch.steady:
            ending = steady.land(now)
            if ending:
                held += [(seq, steady.token, FinishReason.LENGTH) for seq in ending]
                held.sort(key=lambda emit: self.scheduler.running.index(emit[0]))
        outputs = [out for seq, token, reason in held if (out := self._emit(seq, [token], reason, now, stream)) is not None]
        if not self.scheduler.steady_ok():
            return outputs  # the next step visits every sequence: nobody joins to be let go
        running = SequenceStatus.RUNNING
        for seq in batch.seqs:
            if seq.status is running and steady.can_join(seq):
                self.scheduler.join_steady(seq)
        return outputs

    def _land_guesses(self, seq: Sequence, tokens: list[int], now: float, stream: bool) -> RequestOutput | None:
        """A speculating decode's step: its accepted guesses and the model's token land together
        (a rejected guess's KV slot is written again by the next step: nothing to undo)."""
        before = len(seq.output_token_ids)
        reason = self.speculation.land(seq, tokens, now)
        if self.kv.enable_prefix_caching:
            self.kv.cache_full_blocks(seq)
        return self._emit(seq, seq.output_token_ids[before:], reason, now, stream)

    def _emit(
        self, seq: Sequence, tokens: list[int], reason: FinishReason | None, now: float, stream: bool
    ) -> RequestOutput | None:
        """Make the new text, finish seq if it ended; its output, or None when nobody reads it."""
        params = seq.params
        new_text = ""
        if self.tokenizer is not None or params.stop:
            reason, new_text = text_step(self.tokenizer, seq, reason)
        if reason:
            self._finish(seq, reason, now)
        elif not stream:
            return None
        logprobs = seq.output_logprobs[-len(tokens) :] if params.logprobs is not None else None
        return RequestOutput(seq.request_id, tokens, new_text, reason is not None, reason, seq, logprobs)

    def _finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        if seq.export_kv and reason == FinishReason.LENGTH:  # handed off: copied out before freed
            from engine.core.kv_handoff import caches_of, export_prompt  # torch: live engines only

            seq.exported_kv = export_prompt(caches_of(self.runner), seq, self.config.block_size)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if reason == FinishReason.ABORT:
            seq.times.aborted = now
        else:
            seq.times.finished = now
        self.scheduler.remove(seq)
        self.runner.forget(seq.request_id)
        self.requests.pop(seq.request_id, None)

    def _drop_aborted(self) -> list[RequestOutput]:
        outputs = []
        now = self.clock.now()
        for request_id in list(self._to_abort):
            seq = self.requests.get(request_id)
            if seq is not None and seq.in_flight:
                continue  # its blocks are still being written by a pipeline stage: dropped once it lands
            if seq is not None:
                self._finish(seq, FinishReason.ABORT, now)
                outputs.append(RequestOutput(request_id, [], "", True, FinishReason.ABORT, seq))
            self._to_abort.discard(request_id)
        return outputs

    # reporting --------------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        running, kv, memory = self.scheduler.running, self.kv, self.memory
        if self.scheduler.steady is not None:
            self.scheduler.steady.sync()  # the steady decodes' counters, written out for the sum below
        shards = tp_stats(self.shard_group, memory.weight_bytes, memory.bytes_per_block)
        return EngineStats(
            **field_values(shards),
            running=len(running),
            waiting=len(self.scheduler.waiting),
            kv_used_blocks=kv.num_used_blocks,
            kv_total_blocks=kv.num_blocks,
            kv_tokens_used=sum(s.num_computed_tokens for s in running),
            kv_tokens_reserved=kv.num_used_blocks * self.config.block_size,
            num_preemptions=self.scheduler.num_preemptions,
            num_expired=self.scheduler.num_expired,
            expired_prefill_tokens=self.scheduler.expired_prefill_tokens,
            prefix_cache_queries=kv.prefix_queries,
            prefix_cache_hits=kv.prefix_hits,
            num_steps=self.num_steps,
            spec_checks=self.speculation.checks,
            spec_draft_tokens=self.speculation.proposed,
            spec_accepted_tokens=self.speculation.accepted,
            batch_size=len(self.last_batch.seqs) + self.last_batch.steady,
            weight_bytes=memory.weight_bytes,
            param_bytes=memory.param_bytes,
            kv_budget_bytes=memory.kv_budget_bytes,
            kv_bytes_per_token=memory.bytes_per_block // self.config.block_size,
        )

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any (a no-op for one rank)."""
        if self.shard_group is not None:
            self.shard_group.close()

    def reconfigure(self, **changes: Any) -> None:
        """Apply the levers a running engine can take in place (IN_PLACE_FIELDS); the scheduler
        and block manager read them from the next step on."""
        unknown = set(changes) - IN_PLACE_FIELDS
        if unknown:
            raise InvalidParamError(min(unknown), "needs a rebuilt replica, not a change in place")
        self.config = self.config.replace(**changes)
        self.scheduler.config = self.config
        if "num_speculative_tokens" in changes:  # guesses made for the old count are not checked
            for seq in self.scheduler.running:
                seq.spec_token_ids = ()
        if "prefix_caching" in changes and isinstance(self.kv, BlockManager):
            self.kv.enable_prefix_caching = self.config.prefix_caching

