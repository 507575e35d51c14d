"""OpenAI request parsing: every field a client may send is known here, with what it does.

A field is implemented, accepted because it changes nothing in the output (user, metadata,
store, ...), or refused with a 400 naming it when it asks for something this server does not do
(tools, images, logit_bias, ...): never a silent no-op. A field nobody knows is a 400 naming it
too, as OpenAI answers ("Unrecognized request argument supplied: X"). The list was checked
against what the openai SDK, guidellm 0.8 and `vllm bench serve` send. Nothing here knows Flask."""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidParamError, ServingError
from engine.sampling_params import MAX_LOGPROBS, SamplingParams
from engine.serving.telemetry.traces import MAX_USER_LENGTH

log = logging.getLogger("servelab.api")

MAX_N = 128  # OpenAI's bound on choices per request
MAX_PRIORITY = 1_000_000

# Implemented (or read) by the parser, on both endpoints. vLLM's sampling extras are included.
COMMON = {
    "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
    "stop", "seed", "presence_penalty", "frequency_penalty", "logprobs", "user",
    "ignore_eos", "top_k", "min_p", "min_tokens", "repetition_penalty", "stop_token_ids", "priority",
}  # fmt: skip
COMPLETION_ONLY = {"prompt", "echo", "best_of", "return_token_ids"}  # return_token_ids: vLLM's (>= 0.10.2)
CHAT_ONLY = {"messages", "top_logprobs", "add_generation_prompt"}
# Accepted and not acted on: they change nothing in what is generated.
NO_EFFECT = {
    "metadata": dict, "store": bool, "service_tier": str, "prompt_cache_key": str, "prompt_cache_retention": str,
    "safety_identifier": str, "parallel_tool_calls": bool, "request_id": str,
}  # fmt: skip


def _empty(value: Any) -> bool:
    return value in (None, {}, [], "")


# Known but not implemented: accepted only at the value that means "off" (the test says which).
UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "logit_bias": (_empty, "logit_bias is not supported"),
    "suffix": (_empty, "suffix (insertion) is not supported"),
    "response_format": (
        lambda v: v is None or v == {"type": "text"},
        "only response_format {'type': 'text'} is supported (no JSON mode or schemas)",
    ),
    "tools": (_empty, "tool calling is not supported"),
    "tool_choice": (lambda v: v in (None, "none", "auto"), "tool calling is not supported"),
    "functions": (_empty, "function calling is not supported"),
    "function_call": (lambda v: v in (None, "none", "auto"), "function calling is not supported"),
    "modalities": (lambda v: v in (None, ["text"]), "only the text modality is supported"),
    "audio": (_empty, "audio output is not supported"),
    "prediction": (_empty, "predicted outputs are not supported"),
    "reasoning_effort": (_empty, "this model does not reason; reasoning_effort is not supported"),
    "verbosity": (_empty, "verbosity is not supported"),
    "web_search_options": (_empty, "web search is not supported"),
    "moderation": (_empty, "moderation is not supported"),
    "prompt_cache_options": (_empty, "prompt_cache_options is not supported"),
    "continue_final_message": (lambda v: not v, "continue_final_message is not supported"),
    "chat_template_kwargs": (_empty, "chat_template_kwargs is not supported"),
    "skip_special_tokens": (lambda v: v in (None, True), "special tokens are always skipped"),
    "include_stop_str_in_output": (lambda v: not v, "include_stop_str_in_output is not supported"),
}


class RequestKind(enum.StrEnum):
    """Which OpenAI endpoint a request came to (its route says; the body never does)."""

    COMPLETION = "completion"  # /v1/completions
    CHAT = "chat"  # /v1/chat/completions


@dataclass
class ParsedRequest:
    kind: RequestKind
    prompts: list[str | list[int]]  # completions: one or a batch; chat: empty (see messages)
    messages: list[dict[str, Any]]  # chat: ready for the chat template
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool  # vLLM's stream_options.continuous_usage_stats: usage on every chunk
    echo: bool
    logprobs: int | None  # top logprobs per position (completions' logprobs, chat's top_logprobs)
    add_generation_prompt: bool
    request_id: str
    created: int
    score_only: bool = False  # echo with max_tokens 0: the prompt's logprobs, nothing generated
    priority: int = 0  # vLLM's extension: lower is scheduled first (aging lifts a long waiter)
    user: str | None = None  # OpenAI's end-user tag: shown on the request's trace row (the swimlanes)
    # vLLM's return_token_ids: each choice carries prompt_token_ids and the generated token_ids (a
    # client resending a conversation's history needs the answer's exact ids to hit the prefix cache).
    return_token_ids: bool = False


def bad(message: str, param: str | None, code: str = "invalid_value", status: int = 400) -> ServingError:
    return ServingError(status, message, param, code)


def check(body: dict[str, Any], name: str, types: tuple[type, ...], required: bool = False, label: str = "") -> Any:
    """body[name] if of one of `types` (bool is no int here); None when absent."""
    label = label or name
    value = body.get(name)
    if value is None:
        if required:
            raise bad(f"'{label}' is required", label, "missing_field")
        return None
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise bad(f"'{label}' must be {' or '.join(t.__name__ for t in types)}", label, "invalid_type")
    return value


def parse_request(body: Any, kind: RequestKind, model_name: str) -> ParsedRequest:
    kind = RequestKind(kind)  # its word works too
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", None, "invalid_json")
    _check_fields(body, kind)
    model = check(body, "model", (str,))
    if model is not None and model != model_name:
        raise bad(f"model '{model}' does not exist; this server serves '{model_name}'", "model", "model_not_found", 404)
    messages: list[dict[str, Any]] = []
    prompts: list[str | list[int]] = []
    if kind is RequestKind.CHAT:
        messages = parse_messages(check(body, "messages", (list,), required=True))
    else:
        prompts = parse_prompts(body.get("prompt"))
    n = check(body, "n", (int,))
    n = 1 if n is None else n
    if not 1 <= n <= MAX_N:
        raise bad(f"'n' must be in [1, {MAX_N}], got {n}", "n")
    best_of = check(body, "best_of", (int,))
    if best_of is not None and best_of != n:
        raise bad("best_of other than n is not supported", "best_of", "unsupported_parameter")
    echo = bool(check(body, "echo", (bool,)))
    logprobs = _logprobs(body, kind)
    stream = check(body, "stream", (bool,)) or False
    options = check(body, "stream_options", (dict,)) or {}
    for key in options:
        if key not in ("include_usage", "continuous_usage_stats", "include_obfuscation"):
            raise bad(f"Unrecognized request argument supplied: stream_options.{key}", f"stream_options.{key}",
                      "unknown_parameter")  # fmt: skip
        check(options, key, (bool,), label=f"stream_options.{key}")
    user = _user(body)
    if user is not None:
        log.info("request from user %r", user)
    for name, kind_of in NO_EFFECT.items():
        check(body, name, (kind_of,))
    # echo + max_tokens 0 scores the prompt (as OpenAI's legacy completions and eval harnesses do):
    # one token is generated, for the prefill to run, and not returned.
    score_only = echo and any(_is_int(body.get(k)) and body[k] == 0 for k in ("max_tokens", "max_completion_tokens"))
    params = _sampling_params(
        {**body, "max_tokens": 1, "max_completion_tokens": None} if score_only else body, echo, logprobs
    )
    req = ParsedRequest(
        kind, prompts, messages, params, n, stream,
        bool(options.get("include_usage")), bool(options.get("continuous_usage_stats")), echo, logprobs,
        check(body, "add_generation_prompt", (bool,)) is not False,
        f"{'chatcmpl' if kind is RequestKind.CHAT else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()), score_only,
        _priority(body), user, bool(check(body, "return_token_ids", (bool,))),
    )  # fmt: skip
    return req


def _user(body: dict[str, Any]) -> str | None:
    user = check(body, "user", (str,))
    if user is not None and len(user) > MAX_USER_LENGTH:
        raise bad(f"'user' must be at most {MAX_USER_LENGTH} characters, got {len(user)}", "user")
    return user


def _priority(body: dict[str, Any]) -> int:
    priority = check(body, "priority", (int,))
    if priority is None:
        return 0
    if abs(priority) > MAX_PRIORITY:
        raise bad(f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, got {priority}", "priority")
    return priority


def _check_fields(body: dict[str, Any], kind: RequestKind) -> None:
    known = COMMON | (CHAT_ONLY if kind is RequestKind.CHAT else COMPLETION_ONLY) | set(NO_EFFECT) | set(UNSUPPORTED)
    for name, value in body.items():
        if name not in known:
            raise bad(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
        rule = UNSUPPORTED.get(name)
        if rule is not None and not rule[0](value):
            raise bad(rule[1], name, "unsupported_parameter")


def _logprobs(body: dict[str, Any], kind: RequestKind) -> int | None:
    """Completions: logprobs = k. Chat: logprobs = true, top_logprobs = k (needs logprobs)."""
    if kind is RequestKind.CHAT:
        wanted = check(body, "logprobs", (bool,))
        top = check(body, "top_logprobs", (int,))
        if top is not None and not wanted:
            raise bad("top_logprobs needs logprobs set to true", "top_logprobs")
        name, k = "top_logprobs", (top or 0) if wanted else None
    else:
        name, k = "logprobs", check(body, "logprobs", (int,))
    if k is not None and not 0 <= k <= MAX_LOGPROBS:
        raise bad(f"'{name}' must be in [0, {MAX_LOGPROBS}], got {k}", name)
    return k


def _sampling_params(body: dict[str, Any], echo: bool, logprobs: int | None) -> SamplingParams:
    max_tokens = check(body, "max_completion_tokens", (int,))
    if max_tokens is None:
        max_tokens = check(body, "max_tokens", (int,))
    stop = check(body, "stop", (str, list))
    stop_ids = check(body, "stop_token_ids", (list,)) or []
    try:
        return SamplingParams(
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            top_k=_top_k(body),
            min_p=_number(body, "min_p", 0.0),
            seed=check(body, "seed", (int,)),
            max_tokens=16 if max_tokens is None else max_tokens,
            min_tokens=check(body, "min_tokens", (int,)) or 0,
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            stop_token_ids=list(stop_ids),
            ignore_eos=check(body, "ignore_eos", (bool,)) or False,
            presence_penalty=_number(body, "presence_penalty", 0.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0),
            repetition_penalty=_number(body, "repetition_penalty", 1.0),
            logprobs=logprobs,
            prompt_logprobs=logprobs if echo else None,
        )
    except InvalidParamError as err:
        raise bad(err.message, err.param) from err


def _top_k(body: dict[str, Any]) -> int:
    k = check(body, "top_k", (int,))
    return 0 if k is None or k == -1 else k  # vLLM's "no cut" is -1, ours 0


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = check(body, name, (int, float))
    return default if value is None else float(value)


def parse_prompts(prompt: Any) -> list[str | list[int]]:
    """A string, a list of token ids, a list of strings, or a list of token-id lists."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        prompts = list(prompt)
    elif prompt is None:
        raise bad("'prompt' is required", "prompt", "missing_field")
    else:
        raise bad("'prompt' must be a string, a list of token ids, or a list of either", "prompt")
    for i, p in enumerate(prompts):
        label = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if isinstance(p, list) and not all(_is_int(t) for t in p):
            raise bad(f"'{label}' must be a list of token ids", label)
        if not p:
            raise bad(f"'{label}' must not be empty", label)
    return prompts


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_FIELDS = {"role", "content", "name", "tool_call_id", "tool_calls", "function_call", "refusal", "audio"}


def parse_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """OpenAI messages -> {role, content[, name, tool_call_id]} with content one string: a list
    of parts joins its text parts in order with newlines (as vLLM does); other parts are refused."""
    if not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"'{at}' must be an object with 'role' and 'content'", at)
        for key, value in m.items():
            if key not in MESSAGE_FIELDS:
                raise bad(f"Unrecognized request argument supplied: {at}.{key}", f"{at}.{key}", "unknown_parameter")
            if key in ("tool_calls", "function_call", "audio") and not _empty(value):
                raise bad(f"'{at}.{key}' is not supported (no tool calls or audio)", f"{at}.{key}",
                          "unsupported_parameter")  # fmt: skip
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"'{at}.role' must be one of {', '.join(ROLES)}", f"{at}.role")
        message: dict[str, Any] = {
            # A developer message is the system message of newer OpenAI models.
            "role": "system" if role == "developer" else role,
            "content": _content(m.get("content"), at),
        }
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                message[key] = check(m, key, (str,), label=f"{at}.{key}")
        out.append(message)
    return out


def _content(content: Any, at: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{at}.content' must be a string or a list of content parts", f"{at}.content")
    texts = []
    for j, part in enumerate(content):
        where = f"{at}.content[{j}]"
        if not isinstance(part, dict):
            raise bad(f"'{where}' must be an object with a 'type'", where)
        kind = part.get("type")
        if kind != "text":
            raise bad(f"content part type {kind!r} is not supported: this model reads text only", f"{where}.type",
                      "unsupported_content")  # fmt: skip
        texts.append(check(part, "text", (str,), required=True, label=f"{where}.text"))
    return "\n".join(texts)
