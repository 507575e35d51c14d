"""The offline API: `LLM(...).generate(prompts, SamplingParams(...))` and `LLM.chat(...)`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sequence import FinishReason, RequestTimes, TokenLogprobs
from engine.sampling_params import SamplingParams

Prompt = str | list[int] | dict[str, Any]


@dataclass
class GenerationOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None
    num_cached_tokens: int
    times: RequestTimes
    # When SamplingParams asked for them (engine/sample/logprobs.py): per output token; per prompt token.
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None


class LLM:
    def __init__(self, model: str | None = None, **levers: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **levers))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[GenerationOutput]:
        """Run every prompt to completion, batched together. A prompt is text, a list of token
        ids, or {"prompt_token_ids": [...]}; outputs come back in the prompts' order."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        param_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        ids = []
        try:
            for prompt, p in zip(prompts, param_list):
                request_id = f"offline-{next(self._ids)}"
                if isinstance(prompt, str):
                    self.engine.add_request(request_id, prompt, p)
                else:
                    tokens = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt
                    self.engine.add_request(request_id, None, p, prompt_token_ids=tokens)
                ids.append(request_id)
        except ValueError:
            for request_id in ids:  # leave the engine as it was
                self.engine.abort(request_id)
            self.engine.step()
            raise
        done = {}
        while len(done) < len(ids):
            for out in self.engine.step(stream=False):  # only the ended come back
                if out.finished:
                    done[out.request_id] = out.seq
        return [
            GenerationOutput(
                rid,
                s.prompt_token_ids,
                s.output_token_ids,
                s.output_text,
                s.finish_reason,
                s.num_cached_tokens,
                s.times,
                s.output_logprobs if s.params.logprobs is not None else None,
                s.prompt_logprobs if s.params.prompt_logprobs is not None else None,
            )
            for rid, s in ((rid, done[rid]) for rid in ids)
        ]

    def chat(
        self,
        conversations: list[dict[str, Any]] | list[list[dict[str, Any]]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[GenerationOutput]:
        """Apply the model's chat template to each conversation and generate a reply."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts: list[Prompt] = [self.tokenizer.apply_chat_template(c) for c in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, params)
