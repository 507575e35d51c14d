"""SamplingParams: how one request picks its tokens, what it reports, and when it stops."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import InvalidParamError

MAX_LOGPROBS = 20  # OpenAI's cap on top logprobs per position


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0  # EOS and stop tokens are masked until this many were generated
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # OpenAI's penalties over the output so far; repetition (HF/vLLM) over prompt and output.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Log probabilities: None = none; k = the chosen token's and the k most likely at each
    # generated position (logprobs) or each prompt position (prompt_logprobs, e.g. for echo).
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise InvalidParamError("temperature", f"must be a number >= 0, got {t!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise InvalidParamError("top_p", f"must be in (0, 1], got {p!r}")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InvalidParamError("top_k", f"must be an integer >= 0, got {k!r}")
        if not _number(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidParamError("min_p", f"must be in [0, 1], got {self.min_p!r}")
        m = self.max_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InvalidParamError("max_tokens", f"must be an integer >= 1, got {m!r}")
        mt = self.min_tokens
        if isinstance(mt, bool) or not isinstance(mt, int) or not 0 <= mt <= m:
            raise InvalidParamError("min_tokens", f"must be an integer in [0, max_tokens], got {mt!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidParamError("seed", f"must be an integer, got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidParamError("stop", "must be non-empty strings")
        if not all(isinstance(i, int) and i >= 0 for i in self.stop_token_ids):
            raise InvalidParamError("stop_token_ids", "must be non-negative integers")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not -2 <= value <= 2:
                raise InvalidParamError(name, f"must be in [-2, 2], got {value!r}")
        r = self.repetition_penalty
        if not _number(r) or not 0 < r <= 10:
            raise InvalidParamError("repetition_penalty", f"must be in (0, 10], got {r!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS
            ):
                raise InvalidParamError(name, f"must be an integer in [0, {MAX_LOGPROBS}], got {value!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty) or self.repetition_penalty != 1.0


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
