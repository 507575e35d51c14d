"""The scheduler only decides: which sequences run this step and how many tokens each computes.

Continuous batching (vLLM v1's idea): there are no prefill and decode phases. Each sequence has
`num_computed_tokens` catching up with `num_tokens` under a per-step token budget: a decode is
1 token, a prompt is many (split into chunks when chunked prefill is on), a prefix-cache hit
starts the counter ahead. When KV blocks run out, the newest running sequence is preempted
(its blocks freed, recomputed later), and no new sequence is admitted in that step. A prompt is
admitted once its first chunk's blocks fit (vLLM v1), or, with EngineConfig.kv_watermark, once all
of it fits with that share of the blocks left free (vLLM v0's can_allocate).

Two policies of the 2024 engines, off by default (EngineConfig.prefill_first, scheduler_steps):
prompts in steps of their own, the decodes running only when no prompt can, and multi-step runs,
a decode batch scheduled once for N steps (_schedule_policy).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.clock import Clock
from engine.config import EngineConfig
from engine.core import admission
from engine.core.block_manager import BlockManager, blocks_for
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.steady_decodes import SteadyDecodes

# How fast waiting raises a request's priority: one priority level per second of waiting.
AGING_PER_SECOND = 1.0


@dataclass
class SchedulerOutput:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    expired: list[Sequence] = field(default_factory=list)  # dropped unstarted: their deadline passed
    continued: bool = False  # a later step of a multi-step run: nothing was scheduled for it
    # Steady decodes (engine/core/steady_decodes.py) that run this step besides seqs, a token each, and
    # their computed tokens before it: counted, not listed.
    steady: int = 0
    steady_context: int = 0

    @property
    def empty(self) -> bool:
        return not self.seqs and not self.steady

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)


class Scheduler:
    def __init__(self, config: EngineConfig, kv: BlockManager, clock: Clock) -> None:
        self.config = config
        self.kv = kv
        self.clock = clock
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []  # admission order: oldest first
        self.num_preemptions = 0
        self.num_expired = 0  # waiters dropped at their deadline before any prefill
        self.expired_prefill_tokens = 0  # prompt tokens prefilled for requests already past it
        # A multi-step run (EngineConfig.scheduler_steps): its decode batch, and the steps it has
        # left after the one scheduled last.
        self.run_seqs: list[Sequence] = []
        self.run_steps_left = 0
        self.runs_started = 0
        self.in_run = False  # the batch scheduled last is a step of a run
        # A what-if replica's steady decodes (engine/core/steady_decodes.py), and the running sequences
        # that are not among them, in running order; None: every step visits all (use_steady).
        self.steady: SteadyDecodes | None = None
        self.others: list[Sequence] = []

    def use_steady(self, steady: SteadyDecodes) -> None:
        self.steady, self.others = steady, list(self.running)

    def join_steady(self, seq: Sequence) -> None:
        """seq, running, decodes alike from now on (SteadyDecodes.can_join): counted, not visited."""
        assert self.steady is not None
        self.steady.join(seq)
        self.others.remove(seq)

    def _release_steady(self) -> None:
        assert self.steady is not None
        self.steady.release()
        self.others = list(self.running)

    def add(self, seq: Sequence) -> None:
        seq.times.queued = self.clock.now()
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and free its blocks."""
        self._forget_steady(seq)
        try:
            self.running.remove(seq)  # one scan of the batch, not two
        except ValueError:
            if seq in self.waiting:
                self.waiting.remove(seq)
        self.kv.free(seq)

    def schedule(self, max_continuing: int | None = None) -> SchedulerOutput:
        """max_continuing: at most this many running sequences go on in this batch (a pipelined
        replica splits them over its batches in flight, as vLLM v0's virtual engines did)."""
        config = self.config
        steady = self.steady
        if steady is not None and steady.members and not self.steady_ok(max_continuing):
            self._release_steady()
        if config.prefill_first or config.scheduler_steps > 1:
            return self._schedule_policy(max_continuing)
        out, budget = self._continue_running(max_continuing)
        if not out.preempted:
            self._admit(out, budget)
        return out

    def steady_ok(self, max_continuing: int | None = None) -> bool:
        """Whether this step may run the steady decodes as counts: every running sequence goes on
        (no pipeline share), prompts are chunked, and no block is published to the prefix cache."""
        config = self.config
        return (
            config.chunked_prefill and not config.prefill_first and config.scheduler_steps == 1
            and not self.kv.enable_prefix_caching and not config.num_speculative_tokens
            and (max_continuing is None or max_continuing >= len(self.running))
        )  # fmt: skip

    def _continue_running(self, max_continuing: int | None) -> tuple[SchedulerOutput, int]:
        """The running sequences' tokens (decodes and prompt chunks), preempting the newest when KV
        runs out; the batch and the token budget it leaves."""
        out = SchedulerOutput()
        budget = self.config.max_batched_tokens
        steady = self.steady
        if steady is not None and self.steady_ok(max_continuing):
            left = self._continue_steady(out, budget)
            if left is not None:
                return out, left
            self._release_steady()  # a step that may not run them all: sequence by sequence, as below
        chunked = self.config.chunked_prefill
        seqs, counts, running, bs = out.seqs, out.num_new_tokens, SequenceStatus.RUNNING, self.kv.block_size
        add_seq, add_count = seqs.append, counts.append  # bound once: this loop runs for every sequence
        # The cap is checked only where it can bind (a pipelined replica's share of the batch).
        cap = max_continuing if max_continuing is not None and max_continuing < len(self.running) else None
        speculating = self.config.num_speculative_tokens > 0
        for seq in list(self.running):  # a copy: preemption takes from the end as it goes
            if seq.status is not running or seq.in_flight:  # preempted earlier in this loop, or in a stage
                continue
            if cap is not None and len(seqs) >= cap:
                break
            done = seq.num_computed_tokens
            # seq.num_tokens, inlined: this loop runs for every sequence of every step
            remaining = len(seq.prompt_token_ids) + len(seq.output_token_ids) - done
            if chunked:
                n = remaining if remaining < budget else budget  # noqa: FURB136 (min() is a call, per sequence)
            else:  # without chunking a prompt runs whole; a step's first one may exceed the budget
                n = remaining if remaining <= budget or not seqs else 0
            if n <= 0:
                continue
            if speculating and remaining == 1 and seq.spec_token_ids:
                n = self._with_guesses(seq, budget)
            # Most decodes: the last block has room.
            if done + n <= len(seq.block_table) * bs or self.kv.allocate(seq, n):
                add_seq(seq)
                add_count(n)
                budget -= n
                continue
            while True:
                # The newest that is not in a pipeline stage (seq itself at the latest).
                victim = next(s for s in reversed(self.running) if not s.in_flight)
                self._preempt(victim, out)
                if victim is seq:
                    break
                if self.kv.allocate(seq, n):
                    seqs.append(seq)
                    counts.append(n)
                    budget -= n
                    break
        return out, budget

    def _with_guesses(self, seq: Sequence, budget: int) -> int:
        """A decode's tokens with its speculative guesses: 1 + as many as the budget leaves room
        for and free blocks can hold. A guess never preempts anyone: short of blocks, it decodes
        one token as it would have."""
        k = min(len(seq.spec_token_ids), budget - 1)
        if k > 0 and self.kv.allocate(seq, 1 + k):
            seq.spec_token_ids = seq.spec_token_ids[:k]
            return 1 + k
        seq.spec_token_ids = ()
        return 1

    def _continue_steady(self, out: SchedulerOutput, budget: int) -> int | None:
        """_continue_running with the steady decodes as counts: the others visited in running
        order, each member taking one token of the budget in its place. None, having changed
        nothing, when that would not run every member or a block would be short (preemption)."""
        steady, running, kv = self.steady, self.running, self.kv
        assert steady is not None
        members, bs = steady.members, kv.block_size
        plan: list[tuple[Sequence, int]] = []
        passed = blocks = 0  # members passed so far; blocks the others need
        i = -1
        for j, seq in enumerate(self.others):
            i = running.index(seq, i + 1)  # its place in the running order (others keep that order)
            if seq.in_flight:
                return None
            budget -= i - j - passed  # the members between the last one and this one
            passed = i - j
            if budget < 0:
                return None
            done = seq.num_computed_tokens
            remaining = len(seq.prompt_token_ids) + len(seq.output_token_ids) - done
            n = remaining if remaining < budget else budget  # noqa: FURB136
            if n <= 0:
                continue
            blocks += max(0, blocks_for(done + n, bs) - len(seq.block_table))
            plan.append((seq, n))
            budget -= n
        budget -= len(members) - passed
        if budget < 0:
            return None
        growing = steady.growing() if members else []
        if blocks + len(growing) > kv.num_free_blocks:
            return None
        for seq, n in plan:
            assert kv.allocate(seq, n)
            out.add(seq, n)
        if growing:
            kv.add_blocks(growing)
        steady.grew()
        out.steady, out.steady_context = len(members), steady.context
        return budget

    # the policies of the 2024 engines (EngineConfig.prefill_first, scheduler_steps) ----------------

    def _schedule_policy(self, max_continuing: int | None) -> SchedulerOutput:
        """prefill_first: a step of prompt work alone whenever a prompt can be scheduled, else the
        running decodes alone, never admitting (vLLM v0's `_schedule_default`: "Don't schedule
        decodes if prefills are scheduled"; SGLang 0.3's forward_step without mixed chunking).
        scheduler_steps > 1: a decode-only batch runs that many steps (vLLM 0.6's multi-step
        scheduling); any batch with prompt work is one step (vLLM 0.6 gives a prefill no lookahead)."""
        config = self.config
        if self.run_steps_left > 0 and (out := self._continue_run()) is not None:
            self.in_run = True
            return out
        self.in_run = False
        if config.prefill_first:
            out = self._prefill_step()
            if not out.seqs:  # nothing to prefill: the decodes, nothing admitted
                decodes, _ = self._continue_running(max_continuing)
                decodes.expired = out.expired
                out = decodes
        else:
            out, budget = self._continue_running(max_continuing)
            if not out.preempted:
                self._admit(out, budget)
        steps = config.scheduler_steps
        if steps > 1 and out.seqs and all(n == 1 and s.output_token_ids for s, n in zip(out.seqs, out.num_new_tokens)):
            self.run_seqs = list(out.seqs)
            self.run_steps_left = steps - 1
            self.runs_started += 1  # the engine tells one run from the next by it
            self.in_run = True
        return out

    def _prefill_step(self) -> SchedulerOutput:
        """Prompt work only: the next chunk of each running prompt (chunked prefill), then new
        prompts as the budget and the slots allow. A chunk that finds no KV room is left to the
        decode step's loop, which preempts for it."""
        out = SchedulerOutput()
        budget = self.config.max_batched_tokens
        for seq in self.running if self.config.chunked_prefill else ():  # only chunking leaves one part-done
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining <= 1 or seq.in_flight:  # a decode (or a prompt's last token): the decode step's
                continue
            if budget <= 0:
                break
            n = min(remaining, budget)
            if self.kv.allocate(seq, n):
                out.add(seq, n)
                budget -= n
        self._admit(out, budget)
        return out

    def _continue_run(self) -> SchedulerOutput | None:
        """The next step of a multi-step run: the same decode batch less what finished, a token each,
        nothing admitted. None ends the run early: every member finished, or one found no room for
        its next block (vLLM reserves the run's blocks up front; here the normal step preempts)."""
        self.run_steps_left -= 1
        running, bs = SequenceStatus.RUNNING, self.kv.block_size
        out = SchedulerOutput(continued=True)
        for seq in self.run_seqs:
            if seq.status is not running:  # finished (or aborted) in an earlier step of the run
                continue
            if seq.num_computed_tokens + 1 > len(seq.block_table) * bs and not self.kv.allocate(seq, 1):
                self.run_steps_left = 0
                return None
            out.add(seq, 1)
        if not out.seqs:
            self.run_steps_left = 0
            return None
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        now = self.clock.now()
        self._drop_expired(out, now)
        if not self.waiting or budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return  # no room: skip sorting the waiters (thousands of them in a flood)
        aging = self.config.aging  # read each step: the lever applies in place
        if aging:
            # priority - AGING * (now - arrival) ranks waiters the same as priority + AGING * arrival:
            # `now` shifts every key alike, so the key need not be recomputed as time passes.
            order = sorted(self.waiting, key=lambda s: (s.priority + AGING_PER_SECOND * s.times.arrival, s.times.arrival))
        else:  # the failure: a low priority waits as long as anyone better keeps arriving
            order = sorted(self.waiting, key=lambda s: (s.priority, s.times.arrival))
        oldest = min(self.waiting, key=lambda s: s.times.arrival, default=None)
        starving = aging and oldest is not None and now - oldest.times.arrival > self.config.starvation_s
        if starving:  # the reserved slot: nobody overtakes the oldest waiter past the bound
            order.remove(oldest)
            order.insert(0, oldest)
        bs = self.kv.block_size
        reserve = self.config.admission == "reserve"
        unpromised = admission.unpromised_blocks(self.kv, self.running) if reserve else 0
        watermarked = self.config.kv_watermark > 0  # read each step, as the other levers
        owed = sum(admission.owed(s, bs) for s in self.running) if watermarked else 0
        keep_free = int(self.config.kv_watermark * self.kv.num_blocks) if watermarked else 0  # vLLM's int()
        for seq in order:
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            prefix = self.kv.find_cached_prefix(seq)
            remaining = seq.num_tokens - len(prefix) * bs
            n = min(remaining, budget) if self.config.chunked_prefill else remaining
            # Without chunking a prompt longer than the whole budget runs whole beside the running
            # decodes (vLLM's unchunked rule: the budget never splits a prompt): one prefill a step.
            whole = not self.config.chunked_prefill and n > self.config.max_batched_tokens and not out.admitted
            fits = n <= budget or not out.seqs or whole
            if reserve:
                revived = self.kv.num_revived(prefix)
                fits = fits and blocks_for(seq.max_total_tokens, bs) - len(prefix) + revived <= unpromised
            if watermarked and fits and self.running:  # alone on the replica, nothing else will free blocks
                fits = admission.leaves_watermark(self.kv, seq, prefix, owed, keep_free)
            if not fits or not self.kv.can_admit(prefix, n):
                if starving and seq is oldest:
                    break  # hold everything back until the oldest waiter fits
                continue
            free_before = self.kv.num_free_blocks
            self.kv.admit(seq, prefix)
            assert self.kv.allocate(seq, n)
            if reserve:
                unpromised -= free_before - self.kv.num_free_blocks + admission.growth(seq, bs)
            if watermarked:
                owed += admission.owed(seq, bs)
            self.waiting.remove(seq)
            self.running.append(seq)
            if self.steady is not None:
                self.others.append(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.times.scheduled is None:
                seq.times.scheduled = now
                if seq.deadline is not None and now > seq.deadline:  # deadline_recheck off: paid for
                    self.expired_prefill_tokens += seq.num_prompt_tokens - len(prefix) * bs
            out.add(seq, n)
            out.admitted.append(seq)
            budget -= n

    def _drop_expired(self, out: SchedulerOutput, now: float) -> None:
        """The deadline recheck at the replica: a waiter never started whose deadline passed is
        dropped before any prefill is spent on it (the engine answers it)."""
        for seq in [s for s in self.waiting if s.deadline is not None and s.drop_if_expired and now > s.deadline]:
            if seq.times.scheduled is None:
                self.waiting.remove(seq)
                out.expired.append(seq)
                self.num_expired += 1

    def _forget_steady(self, seq: Sequence) -> None:
        """seq leaves the running sequences: out of the steady decodes or the others."""
        if self.steady is None:
            return
        if seq in self.steady:
            self.steady.leave(seq)
        elif seq in self.others:  # not a member that ended this step (SteadyDecodes.land)
            self.others.remove(seq)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute-style preemption: drop the KV, requeue at the front, keep the tokens."""
        self._forget_steady(seq)
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.spec_token_ids = ()
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        seq.times.preempted.append(self.clock.now())
        self.waiting.insert(0, seq)
        self.num_preemptions += 1
        out.preempted.append(seq)

