"""A request's sequence: plain state that the scheduler, block manager and engine move along.

`num_computed_tokens` is the one progress counter (vLLM v1's idea): prefill chunks, prefix-cache
hits and decode steps all just move it toward `num_tokens`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from engine.core.prompt_ids import PromptIds
from engine.sampling_params import SamplingParams


@dataclass
class TokenLogprobs:
    """One position: the token there (chosen or given), its logprob, and the k most likely
    (computed in engine/sample/logprobs.py; a plain record here, so the layers above need no torch)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


class FinishReason(enum.StrEnum):
    """Why a request ended: OpenAI's finish_reason values, and "abort" (cancelled: a client hung up,
    a deadline passed, a replica was lost). A str, so it goes to JSON and the wire unchanged."""

    STOP = "stop"  # an end-of-sequence token, a stop token or a stop string
    LENGTH = "length"  # max_tokens, or the model's context
    ABORT = "abort"
    # Dropped unstarted at its deadline; never reaches a client as such: the replica answers it as
    # the router's "deadline" refusal (engine/serving/replicas/replica.py).
    DEADLINE = "deadline"


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class RequestTimes:
    """Clock readings for one request; metrics are computed from these, never guessed.

    arrival is the one arrival time: the router's admission stamp when a router stands in front
    (so the central queue's wait is inside every figure), the add_request call otherwise."""

    arrival: float
    queued: float | None = None  # reached this engine's scheduler (after any central queue)
    scheduled: float | None = None  # first time it entered a batch
    first_token: float | None = None
    tokens: list[float] = field(default_factory=list)  # one per output token
    preempted: list[float] = field(default_factory=list)
    finished: float | None = None
    aborted: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.tokens, self.tokens[1:])]

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or len(self.tokens) < 2:
            return None
        return (self.tokens[-1] - self.first_token) / (len(self.tokens) - 1)

    @property
    def e2e(self) -> float | None:
        end = self.finished if self.finished is not None else self.aborted
        return None if end is None else end - self.arrival


@dataclass
class DetokenizerState:
    """Offsets into output_token_ids for incremental decoding (see engine/core/detokenizer.py)."""

    prefix_offset: int = 0
    read_offset: int = 0


@dataclass(eq=False, slots=True)  # identity: two requests with equal fields are still two requests
class Sequence:
    request_id: str
    prompt_token_ids: PromptIds  # a range or TokenRuns: a what-if prompt (engine/sim/workload.py)
    params: SamplingParams
    times: RequestTimes
    priority: int = 0  # lower runs sooner; waiting time raises it further
    # The router's deadline (clock time) and whether the scheduler drops the request unstarted
    # once it has passed (the deadline_recheck defence, decided when the router dispatched it).
    deadline: float | None = None
    drop_if_expired: bool = True
    # How the engine's per-step stop check reads this request, fixed when it is added
    # (LLMEngine.add_request): the output length that ends it (max_tokens, or what the context
    # leaves), the token ids that end it (stop tokens, and EOS unless ignored), and whether stop
    # strings are to be looked for in its text. Kept on the sequence so the step loop touches
    # one object per sequence, not its params and their lists.
    max_output: int = 1 << 62
    stop_ids: frozenset[int] = frozenset()
    has_stop_strings: bool = False
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of full blocks
    # The cached blocks its tokens were last compared with (BlockManager.find_cached_prefix): a
    # waiting request is looked up every step, and a long shared prefix need not be compared again.
    verified_blocks: tuple[int, ...] = ()
    num_published_blocks: int = 0  # leading blocks already offered to the prefix cache
    num_preemptions: int = 0
    # Speculative decoding's guesses at its next tokens (engine/sample/spec_decode.py), made after a step
    # and checked in the next one: the scheduler gives it 1 + len of them (fewer if the budget is short).
    spec_token_ids: tuple[int, ...] = ()
    # Prefill/decode disaggregation (engine/core/kv_handoff.py): a prefill replica's request ends after
    # its first token, its prompt's KV blocks copied out here before they are freed.
    export_kv: bool = False
    exported_kv: Any = None  # torch.Tensor [layers, 2, blocks, block_size, kv_heads, head_dim]
    handed_over: bool = False  # on a decode replica, until its first step there (the step record's handoff)
    # In a batch still going through a replica's pipeline stages: not scheduled again, nor
    # preempted, until that batch lands (its next token depends on it).
    in_flight: bool = False
    # Detokenized output so far, and how much of it has been handed to the caller.
    output_text: str = ""
    num_text_emitted: int = 0
    detok: DetokenizerState = field(default_factory=DetokenizerState)
    # When params ask for them: one entry per output token; per prompt token (None for the first).
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]

    def block_tokens(self, start: int, end: int) -> tuple[int, ...]:
        """Tokens [start, end) without building token_ids: the block manager hashes and compares
        one block at a time, and a long prompt's whole list, rebuilt on every look at the cache
        (a waiting request is looked up each step), cost a shared-prefix what-if run most of its time."""
        prompt, n = self.prompt_token_ids, len(self.prompt_token_ids)
        if end <= n:
            return tuple(prompt[start:end])
        if start >= n:
            return tuple(self.output_token_ids[start - n : end - n])
        return (*prompt[start:], *self.output_token_ids[: end - n])

    def token_at(self, index: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[index] if index < n else self.output_token_ids[index - n]

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.params.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


def stop_reason(seq: Sequence, token: int) -> FinishReason | None:
    """Whether the token just added to seq's output ends it: one of its stop ids, or its length
    (stop strings are checked with the text)."""
    if token in seq.stop_ids:
        return FinishReason.STOP
    return FinishReason.LENGTH if len(seq.output_token_ids) >= seq.max_output else None


def needs_processing(seq: Sequence) -> bool:
    """Whether seq's logits change before sampling (engine/sample/logits_processors.py): a penalty, or
    min_tokens' mask still on."""
    return seq.params.penalized or len(seq.output_token_ids) < seq.params.min_tokens
