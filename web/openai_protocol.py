"""OpenAI response shapes: completions and chat, whole or as stream chunks, with logprobs in
each endpoint's own shape. One Choice per prompt x n sample; nothing here knows Flask."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.sequence import FinishReason, RequestTimes, TokenLogprobs
from engine.model.tokenizer import ChatTokenizer
from engine.serving.replicas.messages import TokenDelta
from web.openai_request import ParsedRequest, RequestKind, parse_request

__all__ = ["Choice", "Reply", "parse_request", "server_timing"]


@dataclass
class Choice:
    """One choice being generated: sub-request `request_id`, answered as choices[index]."""

    index: int
    request_id: str
    prompt_index: int
    echo_text: str = ""  # echo: the prompt's text, sent ahead of the first token
    first_prompt_id: int = 0  # echo: the prompt's first token (listed with a null logprob)
    text: list[str] = field(default_factory=list)
    num_tokens: int = 0
    finish_reason: FinishReason | None = None
    finished: bool = False
    started: bool = False  # its first chunk went out (chat: the one with the role)
    submitted: bool = False  # admitted by the router (so an abort has something to stop)
    # Logprobs so far: (token id, its TokenLogprobs, or None for the prompt's first token).
    logprobs: list[tuple[int, TokenLogprobs | None]] = field(default_factory=list)
    text_offset: int = 0  # completions' text_offset of the next token
    # return_token_ids: the prompt's ids and the ids generated so far (vLLM's choice fields).
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


class Reply:
    """Builds the bodies for one request: its choices, usage and logprobs."""

    def __init__(self, req: ParsedRequest, model: str, tokenizer: ChatTokenizer, prompt_lens: list[int]) -> None:
        self.req = req
        self.model = model
        self.tokenizer = tokenizer
        self.prompt_lens = prompt_lens
        self.choices: list[Choice] = []

    @property
    def chat(self) -> bool:
        return self.req.kind is RequestKind.CHAT

    def usage(self) -> dict[str, int]:
        prompt = sum(self.prompt_lens)  # once per prompt, however many samples of it
        completion = sum(c.num_tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def visible(self, delta: TokenDelta) -> TokenDelta:
        """What of a delta the client sees: with score_only, not the one token generated."""
        if not self.req.score_only:
            return delta
        return replace(delta, token_ids=[], text="", logprobs=None, finish_reason=FinishReason.LENGTH)

    def absorb(self, choice: Choice, delta: TokenDelta) -> list[tuple[int, TokenLogprobs | None]]:
        """Fold one delta into its choice; returns the logprob entries it brought."""
        entries: list[tuple[int, TokenLogprobs | None]] = []
        if delta.prompt_logprobs is not None:
            entries += [
                (choice.first_prompt_id, None) if lp is None else (lp.token_id, lp) for lp in delta.prompt_logprobs
            ]
        if delta.logprobs is not None:
            entries += [(lp.token_id, lp) for lp in delta.logprobs]
        choice.logprobs += entries
        choice.text.append(delta.text)
        choice.num_tokens += len(delta.token_ids)
        if self.req.return_token_ids:
            choice.token_ids += delta.token_ids
        if delta.finished:
            choice.finished, choice.finish_reason = True, delta.finish_reason
        return entries

    # bodies -----------------------------------------------------------------------------------

    def chunk(
        self, choice: Choice, text: str, entries: list, finish_reason: FinishReason | None, token_ids: Sequence[int] = ()
    ) -> dict[str, Any]:
        """token_ids: the ids this chunk brings (return_token_ids)."""
        logprobs = None if self.req.logprobs is None else self._logprobs(choice, entries)
        if self.chat:
            delta: dict[str, Any] = {"content": text}
            if not choice.started:
                delta["role"] = "assistant"
            body = {"index": choice.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            body = {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
            if self.req.return_token_ids:  # vLLM's shape: the prompt's ids on the first chunk only
                echoed = choice.prompt_token_ids if self.req.echo and not choice.started else []
                body["prompt_token_ids"] = None if choice.started else choice.prompt_token_ids
                body["token_ids"] = [*echoed, *token_ids]
        choice.started = True
        out = self._envelope(self.chat and "chat.completion.chunk" or "text_completion", [body])
        if self.req.continuous_usage:
            out["usage"] = self.usage()
        return out

    def usage_chunk(self) -> dict[str, Any]:
        out = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        out["usage"] = self.usage()
        return out

    def completion(self) -> dict[str, Any]:
        bodies = []
        for c in sorted(self.choices, key=lambda c: c.index):
            text = c.echo_text + "".join(c.text)
            logprobs = None
            if self.req.logprobs is not None:
                c.text_offset = 0
                logprobs = self._logprobs(c, c.logprobs)
            if self.chat:
                message = {"role": "assistant", "content": text}
                bodies.append(
                    {"index": c.index, "message": message, "logprobs": logprobs, "finish_reason": c.finish_reason}
                )
            else:
                bodies.append({"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason})
                if self.req.return_token_ids:  # vLLM's: with echo, the ids run from the prompt's first
                    echoed = c.prompt_token_ids if self.req.echo else []
                    bodies[-1] |= {"prompt_token_ids": c.prompt_token_ids, "token_ids": [*echoed, *c.token_ids]}
        out = self._envelope("chat.completion" if self.chat else "text_completion", bodies)
        out["usage"] = self.usage()
        return out

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.req.request_id, "object": obj, "created": self.req.created, "model": self.model,
                "choices": choices}  # fmt: skip

    # logprobs, in each endpoint's shape ----------------------------------------------------------

    def _logprobs(self, choice: Choice, entries: list[tuple[int, TokenLogprobs | None]]) -> dict[str, Any]:
        if self.chat:
            return {"content": [self._chat_entry(lp) for _, lp in entries if lp is not None], "refusal": None}
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for token_id, lp in entries:
            token = self.tokenizer.token_text(token_id)
            tokens.append(token)
            offsets.append(choice.text_offset)
            choice.text_offset += len(token)
            token_logprobs.append(None if lp is None else lp.logprob)
            if lp is None:
                top_logprobs.append(None)
                continue
            # The k best, and the chosen token's own (vLLM's completions shape; may be k + 1).
            top = {self.tokenizer.token_text(t): v for t, v in lp.top}
            top.setdefault(token, lp.logprob)
            top_logprobs.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }

    def _chat_entry(self, lp: TokenLogprobs) -> dict[str, Any]:
        return {
            **self._chat_token(lp.token_id, lp.logprob),
            "top_logprobs": [self._chat_token(t, v) for t, v in lp.top],
        }

    def _chat_token(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": self.tokenizer.token_text(token_id), "logprob": logprob,
                "bytes": self.tokenizer.token_bytes(token_id)}  # fmt: skip


def server_timing(times: RequestTimes) -> dict[str, float | None]:
    """ServeLab's extension on a stream's last chunk (`servelab`): the server's own figures for
    this request, from its one arrival time, so a client can set them beside what it measured."""

    def span(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else round(end - start, 6)

    return {
        "ttft_s": span(times.arrival, times.first_token),
        "queue_time_s": span(times.arrival, times.scheduled),
        "central_queue_s": span(times.arrival, times.queued),
        "e2e_s": span(times.arrival, times.tokens[-1] if times.tokens else None),
    }
