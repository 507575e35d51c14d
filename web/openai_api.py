"""The OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions, /v1/models, /health,
/ready, /metrics. Streams are SSE, each chunk flushed as it is made; `: ping` comments keep a
waiting stream alive; an error after the first token goes in-band; a client that disconnects
aborts its request on the replica."""

from __future__ import annotations

import json
import logging
import queue
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import HTTPException

from engine.errors import ServingError
from engine.serving.fleet import Fleet
from engine.serving.messages import RequestError
from web.openai_protocol import ParsedRequest, chunk, completion, parse_request, server_timing, usage

log = logging.getLogger("servelab.api")

MAX_BODY_BYTES = 1 << 20
# How often a waiting stream gets a `: ping` (app.config["SSE_PING_S"]). 10 s by default:
# `vllm bench serve` 0.32 strips each network read before splitting SSE messages, so a comment
# that arrives on its own corrupts its parser; pings past the benchmark's waits keep it working.
DEFAULT_PING_S = 10.0
NO_EVENT_TIMEOUT_S = 600.0  # a non-streaming request that hears nothing for this long fails

api = Blueprint("openai_api", __name__)


def fleet() -> Fleet:
    return current_app.extensions["servelab_fleet"]


def error_response(err: ServingError) -> Response:
    response = Response(json.dumps(err.body()), status=err.status, mimetype="application/json")
    if err.retry_after_s is not None:
        response.headers["Retry-After"] = str(err.retry_after_s)
    return response


@api.app_errorhandler(ServingError)
def _api_error(err: ServingError) -> Response:
    return error_response(err)


@api.app_errorhandler(HTTPException)
def _http_error(err: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(err.code or 0)
    message = "the request body is too large" if err.code == 413 else (err.description or err.name)
    return error_response(ServingError(err.code or 500, message, None, code))


@api.app_errorhandler(Exception)
def _unexpected(err: Exception) -> Response:
    log.exception("unhandled error")  # the details go to the log, never to the client
    return error_response(ServingError(500, "internal server error", None, "internal_error"))


@api.get("/health")
def health() -> Response:
    return Response(json.dumps({"status": "ok"}), mimetype="application/json")


@api.get("/ready")
def ready() -> Response:
    f = fleet()
    body = {"ready": f.ready, "draining": f.draining, "replicas": f.replica_states()}
    return Response(json.dumps(body), status=200 if f.ready else 503, mimetype="application/json")


@api.get("/metrics")
def metrics() -> Response:
    return Response(fleet().metrics_text(), mimetype="text/plain; version=0.0.4")


@api.get("/v1/models")
def models() -> Response:
    f = fleet()
    data = [
        {
            "id": f.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "servelab",
            "max_model_len": f.router.config.max_model_len,
        }
    ]
    return Response(json.dumps({"object": "list", "data": data}), mimetype="application/json")


@api.post("/v1/completions")
def completions() -> Response:
    return _generate("completion")


@api.post("/v1/chat/completions")
def chat_completions() -> Response:
    return _generate("chat")


def _generate(kind: str) -> Response:
    f = fleet()
    api_key = _bearer_key()
    f.router.authorize(api_key)  # a refusal is a ServingError: the error handler answers it
    try:
        body = json.loads(request.get_data(cache=False) or b"null")
    except (ValueError, UnicodeDecodeError) as err:
        raise ServingError(400, "the body is not valid JSON", None, "invalid_json") from err
    req = parse_request(body, kind, f.model_name)
    if req.kind == "chat":
        prompt_ids = f.tokenizer.encode(f.tokenizer.apply_chat_template(req.prompt))  # type: ignore[arg-type]
    else:
        prompt_ids = f.tokenizer.encode(req.prompt) if isinstance(req.prompt, str) else list(req.prompt)
    if not prompt_ids:
        raise ServingError(400, "the prompt encodes to no tokens", "prompt", "invalid_value")
    if any(not 0 <= t < f.tokenizer.vocab_size for t in prompt_ids):
        raise ServingError(400, f"token ids must be in [0, {f.tokenizer.vocab_size})", "prompt", "invalid_value")
    events = f.submit(req.request_id, prompt_ids, req.params, api_key)
    if req.stream:
        return Response(
            _sse(f, req, events, len(prompt_ids), current_app.config.get("SSE_PING_S", DEFAULT_PING_S)),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return _complete(f, req, events, len(prompt_ids))


def _complete(f: Fleet, req: ParsedRequest, events: queue.Queue, num_prompt: int) -> Response:
    text, tokens = [], 0
    while True:
        try:
            event = events.get(timeout=NO_EVENT_TIMEOUT_S)
        except queue.Empty:
            f.router.abort(req.request_id)
            raise ServingError(503, "the request timed out", None, "timeout") from None
        if isinstance(event, RequestError):
            raise _request_error(event)
        text.append(event.text)
        tokens += len(event.token_ids)
        if event.finished:
            body = completion(req, f.model_name, "".join(text), event.finish_reason, num_prompt, tokens)
            return Response(json.dumps(body), mimetype="application/json")


def _sse(f: Fleet, req: ParsedRequest, events: queue.Queue, num_prompt: int, ping_s: float) -> Iterator[str]:
    finished, first, tokens = False, True, 0
    try:
        while True:
            try:
                event = events.get(timeout=ping_s)
            except queue.Empty:
                yield ": ping\n\n"
                continue
            if isinstance(event, RequestError):
                finished = True
                yield _data(_request_error(event).body())
                break
            tokens += len(event.token_ids)
            if event.text or event.finished or first:
                reason = event.finish_reason if event.finished else None
                body = chunk(req, f.model_name, event.text, reason, first)
                if event.finished and event.times is not None:
                    body["servelab"] = server_timing(event.times)
                yield _data(body)
                first = False
            if event.finished:
                finished = True
                if req.include_usage:
                    yield _data(
                        {
                            "id": req.request_id,
                            "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
                            "created": req.created,
                            "model": f.model_name,
                            "choices": [],
                            "usage": usage(num_prompt, tokens),
                        }
                    )
                break
        yield "data: [DONE]\n\n"
    finally:
        if not finished:  # the client went away (GeneratorExit at a yield): stop the work
            f.router.abort(req.request_id)


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _bearer_key() -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None


def _request_error(err: RequestError) -> ServingError:
    if err.param is not None:
        return ServingError(400, err.message, err.param, "invalid_value")
    return ServingError(503, err.message, None, "request_failed", 1)
