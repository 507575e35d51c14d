"""What one engine step hands back for one request (LLMEngine.step)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.sequence import FinishReason, Sequence, TokenLogprobs


@dataclass
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None
    seq: Sequence
    logprobs: list[TokenLogprobs] | None = None  # this step's tokens', when the request asked
