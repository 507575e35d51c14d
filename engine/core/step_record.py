"""What one engine step ran: which requests, prefill or decode, how many tokens each, whom it
preempted, and how much of its time was the model's. LLMEngine makes one at the end of every step
(the live replica process and the simulated replica alike), keeps the latest in a bounded ring, and
a replica ships them to the fleet with its StepMessage; the browser's "batch, step by step" chart
draws them.

A step's span runs from the start of its scheduling to the end of its output processing; model_s
is the part the executor spent in the model (the forward and sampling, as the executor measured
it), and the rest, end - start - model_s, is the host's: scheduling, building the inputs,
processing the outputs and detokenising (issue 42: the time vLLM v1's and SGLang's overlap
schedulers hide)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from engine.core.scheduler import SchedulerOutput
    from engine.core.sequence import Sequence

Phase = Literal["prefill", "decode", "handoff"]
PREFILL: Phase = "prefill"
DECODE: Phase = "decode"
HANDOFF: Phase = "handoff"  # a handed-over prompt landing on a decode replica: its last partial block computed
STEP_RING = 256  # records kept until a replica ships them (a few hundred ms of steps, live)


class StepEntry(NamedTuple):  # immutable, and a third of a frozen dataclass's cost to make (every seq, every step)
    request_id: str
    phase: Phase  # prefill: prompt tokens (or a preempted request's recompute); decode: one new token;
    # handoff: a prompt handed over by a prefill replica, its KV imported, the rest computed here
    tokens: int


@dataclass(frozen=True)
class StepRecord:
    replica: int
    start: float  # the engine's clock: when the step's scheduling began
    end: float  # when its tokens landed and its outputs were processed
    max_batched_tokens: int  # the budget and the slots in force for this step
    max_num_seqs: int
    entries: tuple[StepEntry, ...]
    preempted: tuple[str, ...]  # request ids this step's scheduling preempted
    # Pipeline stages: each stage's (start, end) on this batch, first stage first; empty without.
    stages: tuple[tuple[float, float], ...] = ()
    model_s: float = 0.0  # of end - start, the model's (forward + sampling); the rest is the host's

    @property
    def num_tokens(self) -> int:
        return sum(e.tokens for e in self.entries)

    @property
    def host_s(self) -> float:
        return max(0.0, self.end - self.start - self.model_s)

    def ended(self, end: float, model_s: float) -> StepRecord:
        """Made before the step's outputs were processed (its entries read the batch as it ran),
        closed once they were: the step's end and the model's part of it."""
        return StepRecord(
            self.replica, self.start, end, self.max_batched_tokens, self.max_num_seqs, self.entries, self.preempted,
            self.stages, model_s,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica, "start": self.start, "end": self.end,
            "max_batched_tokens": self.max_batched_tokens, "max_num_seqs": self.max_num_seqs,
            "entries": [e._asdict() for e in self.entries], "preempted": list(self.preempted),
            "stages": [list(span) for span in self.stages], "model_s": self.model_s,
        }  # fmt: skip


def step_record(
    batch: SchedulerOutput,
    replica: int,
    start: float,
    end: float,
    max_batched_tokens: int,
    max_num_seqs: int,
    stages: tuple[tuple[float, float], ...] = (),
) -> StepRecord:
    """Read before the step's tokens are counted: a sequence is still prefilling while its
    computed tokens are short of its prompt (after a preemption, of everything it had)."""
    entries = tuple(
        StepEntry(seq.request_id, DECODE if n == 1 and _decoding(seq) else HANDOFF if seq.handed_over else PREFILL, n)
        for seq, n in zip(batch.seqs, batch.num_new_tokens)
    )
    preempted = tuple(seq.request_id for seq in batch.preempted)
    return StepRecord(replica, start, end, max_batched_tokens, max_num_seqs, entries, preempted, stages)


def _decoding(seq: Sequence) -> bool:
    """A decode computes the one token it sampled last step; anything else reads a prompt."""
    out = seq.output_token_ids
    return bool(out) and seq.num_computed_tokens + 1 == len(seq.prompt_token_ids) + len(out)


class StepRing:
    """The latest StepRecords, bounded; a replica takes what is new each time it reports."""

    def __init__(self, size: int = STEP_RING) -> None:
        self._records: deque[StepRecord] = deque(maxlen=size)

    def append(self, record: StepRecord) -> None:
        self._records.append(record)

    def take(self) -> list[StepRecord]:
        records = list(self._records)
        self._records.clear()
        return records

    def __len__(self) -> int:
        return len(self._records)
