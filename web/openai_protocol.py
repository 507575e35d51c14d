"""OpenAI request parsing and response shapes, kept apart from the HTTP plumbing.

Bad input raises ServingError with the OpenAI error body's fields; nothing here knows Flask."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidParamError, ServingError
from engine.sampling_params import SamplingParams
from engine.sequence import RequestTimes


@dataclass
class ParsedRequest:
    kind: str  # "completion" or "chat"
    prompt: str | list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    request_id: str
    created: int


def _check(body: dict[str, Any], name: str, types: tuple[type, ...], required: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise ServingError(400, f"'{name}' is required", name, "missing_field")
        return None
    if isinstance(value, bool) and bool not in types:
        raise ServingError(400, f"'{name}' must be {' or '.join(t.__name__ for t in types)}", name, "invalid_type")
    if not isinstance(value, types):
        raise ServingError(400, f"'{name}' must be {' or '.join(t.__name__ for t in types)}", name, "invalid_type")
    return value


def parse_request(body: Any, kind: str, model_name: str) -> ParsedRequest:
    if not isinstance(body, dict):
        raise ServingError(400, "the body must be a JSON object", None, "invalid_json")
    model = _check(body, "model", (str,))
    if model is not None and model != model_name:
        raise ServingError(
            404, f"model '{model}' does not exist; this server serves '{model_name}'", "model", "model_not_found"
        )
    if kind == "chat":
        messages = _check(body, "messages", (list,), required=True)
        if not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise ServingError(
                400, "'messages' must be a non-empty list of {role, content} strings", "messages", "invalid_value"
            )
        prompt: str | list[int] = messages  # type: ignore[assignment]  # templated by the caller
    else:
        prompt = _check(body, "prompt", (str, list), required=True)
        if isinstance(prompt, list) and not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ServingError(
                400,
                "'prompt' must be a string or one list of token ids (batches are not supported)",
                "prompt",
                "invalid_value",
            )
        if not prompt:
            raise ServingError(400, "'prompt' must not be empty", "prompt", "invalid_value")
    n = _check(body, "n", (int,))
    if n is not None and n != 1:
        raise ServingError(400, "only n=1 is supported", "n", "invalid_value")
    max_tokens = _check(body, "max_completion_tokens", (int,))
    if max_tokens is None:
        max_tokens = _check(body, "max_tokens", (int,))
    stop = _check(body, "stop", (str, list))
    stream = _check(body, "stream", (bool,)) or False
    options = _check(body, "stream_options", (dict,)) or {}
    try:
        params = SamplingParams(
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            top_k=_check(body, "top_k", (int,)) or 0,
            seed=_check(body, "seed", (int,)),
            max_tokens=16 if max_tokens is None else max_tokens,
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            ignore_eos=_check(body, "ignore_eos", (bool,)) or False,
        )
    except InvalidParamError as err:
        raise ServingError(400, err.message, err.param, "invalid_value") from err
    return ParsedRequest(
        kind,
        prompt,
        params,
        stream,
        bool(options.get("include_usage")),
        f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
        int(time.time()),
    )


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = _check(body, name, (int, float))
    return default if value is None else float(value)


def chunk(req: ParsedRequest, model: str, text: str, finish_reason: str | None, first: bool) -> dict[str, Any]:
    if req.kind == "chat":
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": req.request_id, "object": obj, "created": req.created, "model": model, "choices": [choice]}


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


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    req: ParsedRequest, model: str, text: str, finish_reason: str | None, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    if req.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {
        "id": req.request_id,
        "object": obj,
        "created": req.created,
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
