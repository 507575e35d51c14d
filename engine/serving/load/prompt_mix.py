"""Traffic whose prompts share prefixes, as a real service's do: one system prompt at the head of
many requests, and conversations whose every turn resends the whole history. Both make blocks
that the prefix cache can serve (engine/core/block_manager.py) and that prefix-aware routing can aim at
(engine/serving/routing/router.py); random prompts alone never share a block.

The logic is here once, for the live lab's traffic (engine/lab/traffic.py, ids as lists sent to a
real engine), the simulated lab (engine/lab/simulated/lab_sim.py) and the simulator's request
lists (engine/sim/workload.py), whose ids stay compact (ranges and TokenRuns). Each draws from
its one seeded rng in the same order:

    turn = next_turn(mix, rng, conversations)     # which conversation, carries the system prompt?, own length
    n_out = draw_length(rng, output_tokens, 0.5)  # the caller's draw, where the plain traffic drew it
    ids = turn.build(own_ids, system_ids)         # history + new message, or [system prompt] + own part

A mix with no system prompt and one turn per conversation draws exactly what the plain traffic
drew before this module existed, so a seeded run without shared prefixes is unchanged."""

from __future__ import annotations

import heapq
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from engine.core.prompt_ids import TokenRuns
from engine.core.sequence import FinishReason
from engine.core.sequence import Sequence as EngineSequence

VOCAB = (100, 49000)  # the model's ordinary token ids: no specials, so no tokenizer is needed
SPREAD = 0.5  # the lab's traffic draws lengths within +-50% of the means


def draw_length(rng: random.Random, mean: int, ratio: float) -> int:
    """A length uniform in mean x [1 - ratio, 1 + ratio], at least 1 (vLLM's random dataset)."""
    lo = max(1, int(mean * (1 - ratio)))
    return rng.randint(lo, max(lo, int(mean * (1 + ratio))))


@dataclass(frozen=True)
class PromptMix:
    """What the load levers say about prompts (engine/levers.py: prompt_tokens,
    system_prompt_tokens, system_prompt_share, conversation_turns)."""

    prompt_tokens: int  # the mean of the whole prompt, system prompt included
    system_prompt_tokens: int = 0
    system_prompt_share: float = 1.0  # of requests (of conversations: a conversation keeps its first turn's)
    conversation_turns: int = 1
    range_ratio: float = SPREAD  # lengths uniform in mean x [1 - r, 1 + r] (draw_length)

    @classmethod
    def from_levers(cls, levers: Mapping[str, Any], range_ratio: float = SPREAD) -> PromptMix:
        return cls(
            int(levers["prompt_tokens"]), int(levers.get("system_prompt_tokens", 0)),
            float(levers.get("system_prompt_share", 1.0)), int(levers.get("conversation_turns", 1)), range_ratio,
        )  # fmt: skip

    @property
    def multi_turn(self) -> bool:
        return self.conversation_turns > 1

    def carries(self, rng: random.Random) -> bool:
        """Whether a new conversation starts with the system prompt. The rng is drawn only for a
        share strictly between 0 and 1, so a mix without one draws what plain traffic draws."""
        if self.system_prompt_tokens <= 0 or self.system_prompt_share <= 0:
            return False
        return self.system_prompt_share >= 1 or rng.random() < self.system_prompt_share

    def own_length(self, rng: random.Random, carrier: bool) -> int:
        """The request's own part (a new user message). prompt_tokens stays the mean of the whole
        prompt: a carrier's own part is drawn around what the system prompt leaves (at least 1), so
        a longer system prompt at the same prompt_tokens makes more of each prompt cacheable; a
        request without it draws its whole prompt around prompt_tokens, so the share changes what
        is cacheable, not the load."""
        mean = max(1, self.prompt_tokens - self.system_prompt_tokens) if carrier else self.prompt_tokens
        return draw_length(rng, mean, self.range_ratio)


@dataclass(eq=False)
class Conversation:
    number: int  # in order of starting: the oldest ready one is continued first
    system_len: int  # the system prompt's tokens it starts with (0: none)
    prompt: Sequence[int] = ()  # its latest turn's prompt
    turns: int = 0  # turns sent
    answer: Sequence[int] | None = None  # the latest turn's answer, exactly as the engine generated it


class Conversations:
    """The conversations whose latest turn has been answered, oldest first. Thread-safe: the live
    lab's turns end on their clients' threads."""

    def __init__(self) -> None:
        self._ready: list[tuple[int, Conversation]] = []  # a heap by number
        self._numbers = count()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ready)

    def start(self, system_len: int) -> Conversation:
        return Conversation(next(self._numbers), system_len)

    def take(self) -> Conversation | None:
        with self._lock:
            return heapq.heappop(self._ready)[1] if self._ready else None

    def ended(self, conversation: Conversation | None, answer: Sequence[int] | None, turns: int) -> None:
        """The latest turn ended: with its answer's ids it may go on (if `turns` leaves it more);
        None (refused, failed, cut, or answered without its ids) ends the conversation."""
        if conversation is None or not answer or conversation.turns >= turns:
            return
        conversation.answer = answer
        with self._lock:
            heapq.heappush(self._ready, (conversation.number, conversation))


@dataclass
class Turn:
    """The next request's shape, drawn by next_turn; build() makes its ids."""

    conversation: Conversation | None  # None: single requests (conversation_turns 1)
    system_len: int  # 0, or the system prompt's tokens at its head
    own_len: int  # the new part: a request's own tokens, or a conversation's new user message
    history: tuple[Sequence[int], ...] = field(default=())  # a later turn: the last prompt, then its answer
    prompt: Sequence[int] = ()  # the ids build() made

    @property
    def prompt_len(self) -> int:
        return sum(len(part) for part in self.history) + (0 if self.history else self.system_len) + self.own_len

    def build(
        self, own: Sequence[int], system_ids: Callable[[int], Sequence[int]], compact: bool = False
    ) -> Sequence[int]:
        """The prompt's ids: the history (or system_ids(system_len), the system prompt) then `own`
        (own_len ids, or fewer: a prompt in words has its own length, engine/serving/load/text_prompts.py). compact: TokenRuns over the parts, as the simulator keeps prompts; else one
        list, as a client sends it. The conversation remembers it as its latest prompt."""
        assert len(own) <= self.own_len
        head = list(self.history) if self.history else [system_ids(self.system_len)] if self.system_len else []
        ids: Sequence[int]
        if compact:
            ids = TokenRuns([*head, own]) if head else own
        else:
            ids = [token for part in (*head, own) for token in part]
        self.prompt = ids
        if self.conversation is not None:
            self.conversation.prompt = ids
            self.conversation.turns += 1
        return ids


def next_turn(
    mix: PromptMix, rng: random.Random, conversations: Conversations | None = None, max_prompt: int | None = None
) -> Turn:
    """The next arrival's turn, drawn from rng (the carrier draw, then the new part's length)."""
    return pick_turn(mix, conversations, max_prompt, lambda: mix.carries(rng), lambda c: mix.own_length(rng, c))


def pick_turn(
    mix: PromptMix, conversations: Conversations | None, max_prompt: int | None,
    carries: Callable[[], bool], own_length: Callable[[bool], int],
) -> Turn:
    """Open loop: if a conversation's latest turn has been answered and it has turns left, its next
    turn goes (the oldest first), else a new conversation (or, at one turn, a single request)
    starts. A conversation whose history and new message would pass max_prompt tokens (the
    context, less room for the answer) ends there, as a chat app starts a new chat. carries and
    own_length are the draws (a request list's are made beforehand: engine/sim/workload.py)."""
    if mix.multi_turn and conversations is not None:
        while (conversation := conversations.take()) is not None:
            if conversation.turns >= mix.conversation_turns or conversation.answer is None:
                continue  # the lever came down meanwhile: this one is over
            own = own_length(conversation.system_len > 0)
            history = (conversation.prompt, conversation.answer)
            if max_prompt is None or len(history[0]) + len(history[1]) + own <= max_prompt:
                return Turn(conversation, conversation.system_len, own, history)
    system_len = mix.system_prompt_tokens if carries() else 0
    own = own_length(system_len > 0)
    started = conversations.start(system_len) if mix.multi_turn and conversations is not None else None
    return Turn(started, system_len, own)


class SystemPrompts:
    """The system prompt's ids for one seed, in VOCAB: the first n of one seeded stream, so the
    same seed gives the same prompt and a longer one starts with a shorter one (live traffic)."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(f"system-prompt-{seed}")
        self._ids: list[int] = []
        self._lock = threading.Lock()

    def ids(self, n: int) -> list[int]:
        with self._lock:
            while len(self._ids) < n:
                self._ids.append(self._rng.randrange(*VOCAB))
            return self._ids[:n]


def compact_system_ids(n: int) -> range:
    """The simulator's system prompt: a descending run from VOCAB's top. A simulated request's own
    part is an ascending run (engine/sim/workload.py), so no block of one can equal a block of the
    other: only the system prompt's blocks are shared."""
    top = VOCAB[1] - 1
    return range(top, top - n, -1)


class OpenTurns:
    """Conversation turns sent and not yet ended, by request id, for a sender told of each end by
    id (the simulated lab's fleet). A turn whose end never comes (expired in the queue, its
    replica failed) has ended its conversation; the oldest are forgotten past `limit`."""

    def __init__(self, conversations: Conversations, limit: int = 50_000) -> None:
        self.conversations = conversations
        self.limit = limit
        self._turns: dict[str, Turn] = {}

    def __len__(self) -> int:
        return len(self._turns)

    def sent(self, request_id: str, turn: Turn) -> None:
        if turn.conversation is None:
            return
        self._turns[request_id] = turn
        if len(self._turns) > self.limit:
            del self._turns[next(iter(self._turns))]

    def turn(self, request_id: str) -> Turn | None:
        """The turn a request sent and not yet ended (None: not a conversation's)."""
        return self._turns.get(request_id)

    def prompt_len(self, request_id: str) -> int | None:
        """The turn's prompt length (None: not a conversation's turn)."""
        turn = self._turns.get(request_id)
        return None if turn is None else len(turn.prompt)

    def ended(self, request_id: str, answer: Sequence[int] | None, turns: int) -> None:
        turn = self._turns.pop(request_id, None)
        if turn is not None:
            self.conversations.ended(turn.conversation, answer, turns)

    def answered(self, seq: EngineSequence, turns: int) -> None:
        """A turn's sequence ended in an engine: its answer is exactly the ids that engine made. A
        decode replica's prompt carries the prefill replica's token, the answer's first."""
        sent = self.prompt_len(seq.request_id)
        if sent is not None:
            ok = seq.finish_reason != FinishReason.ABORT
            self.ended(seq.request_id, [*seq.prompt_token_ids[sent:], *seq.output_token_ids] if ok else None, turns)
