"""The OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions, /v1/models, /health,
/ready, /metrics. Streams are SSE, each chunk flushed as it is made; `: ping` comments keep a
waiting stream alive; an error after the first token goes in-band; a client that disconnects
aborts its request on the replica.

Three of those are defences a learner can switch off (issue 15), read at the moment they act:
`heartbeat` (fleet.defences: no `: ping`, so an idle-timeout proxy cuts a waiting stream),
`cancel_on_disconnect` (fleet.defences: a client that hangs up leaves its request running to
the end, every token after it left counted as wasted), and the app's SSE_FLUSH (`python -m
engine serve --stream-flush false`: the whole stream is held and sent when it ends, the
buffering proxy's failure one hop further in; the teaching app's lab puts its own proxy in
front instead)."""

from __future__ import annotations

import json
import logging
import queue
from collections.abc import Generator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import HTTPException

from engine.errors import ServingError
from engine.serving.replicas.messages import RequestError
from web.openai_protocol import Choice, Reply, parse_request, server_timing
from web.openai_request import ParsedRequest, RequestKind
from web.page_session import PageSessions

if TYPE_CHECKING:  # the fleet (and torch, in its replicas) is the composition root's to import
    from engine.serving.scaling.fleet import Fleet

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


def _engine(f: Fleet) -> dict[str, Any] | None:
    """What the engine runs on this machine and why (dtype, linear and attention paths, threads)."""
    plan = f.engine_plan
    return plan.to_json() if plan is not None else None


@api.get("/health")
def health() -> Response:
    """200 while the server can serve (or is still loading); 503 once no replica can load here,
    with the reason: a restart of the same configuration would fail the same way."""
    f = fleet()
    body: dict[str, Any] = {"status": "ok" if f.unservable is None else "failed", "engine": _engine(f)}
    if f.unservable is not None:
        body["error"] = f.unservable
    return Response(json.dumps(body), status=200 if f.unservable is None else 503, mimetype="application/json")


@api.get("/ready")
def ready() -> Response:
    f = fleet()
    body = {"ready": f.ready, "draining": f.draining, "replicas": f.replica_states(), "error": f.unservable}
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
            "servelab_engine": _engine(f),  # dtype, paths and why, on this machine
        }
    ]
    return Response(json.dumps({"object": "list", "data": data}), mimetype="application/json")


@api.post("/v1/completions")
def completions() -> Response:
    return _generate(RequestKind.COMPLETION)


@api.post("/v1/chat/completions")
def chat_completions() -> Response:
    return _generate(RequestKind.CHAT)


def _generate(kind: RequestKind) -> Response:
    f = fleet()
    api_key = request_credential()
    f.router.authorize(api_key)  # a refusal is a ServingError: the error handler answers it
    try:
        body = json.loads(request.get_data(cache=False) or b"null")
    except (ValueError, UnicodeDecodeError) as err:
        raise ServingError(400, "the body is not valid JSON", None, "invalid_json") from err
    req = parse_request(body, kind, f.model_name)
    prompts = _prompt_ids(f, req)
    out = Reply(req, f.model_name, f.tokenizer, [len(ids) for ids in prompts])
    # One sub-request per prompt x sample, all on one event queue; choice index = prompt * n + sample.
    events: queue.Queue = queue.Queue()
    for p, ids in enumerate(prompts):
        for j in range(req.n):
            index = p * req.n + j
            rid = req.request_id if len(prompts) * req.n == 1 else f"{req.request_id}-{index}"
            echo = f.tokenizer.decode(ids) if req.echo else ""
            out.choices.append(Choice(index, rid, p, echo, ids[0], prompt_token_ids=ids if req.return_token_ids else []))
    try:
        for choice in out.choices:
            j = choice.index % req.n
            # Samples of one prompt are independent: with a seed, each gets its own (seed + j).
            params = req.params if not j or req.params.seed is None else replace(req.params, seed=req.params.seed + j)
            f.submit(
                choice.request_id, prompts[choice.prompt_index], params, api_key, events=events, priority=req.priority,
                user=req.user,
            )
            choice.submitted = True
    except ServingError:
        _abort(f, out.choices)  # all or none: the ones already admitted stop
        raise
    if req.stream:
        stream = _sse(f, out, events, current_app.config.get("SSE_PING_S", DEFAULT_PING_S))
        return Response(
            stream if current_app.config.get("SSE_FLUSH", True) else _held(stream),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return _complete(f, out, events)


def _prompt_ids(f: Fleet, req: ParsedRequest) -> list[list[int]]:
    if req.kind is RequestKind.CHAT:
        text = f.tokenizer.apply_chat_template(req.messages, add_generation_prompt=req.add_generation_prompt)
        prompts = [f.tokenizer.encode(text)]
    else:
        prompts = [f.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in req.prompts]
    for i, ids in enumerate(prompts):
        param = "messages" if req.kind is RequestKind.CHAT else "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if not ids:
            raise ServingError(400, "the prompt encodes to no tokens", param, "invalid_value")
        if any(not 0 <= t < f.tokenizer.vocab_size for t in ids):
            raise ServingError(400, f"token ids must be in [0, {f.tokenizer.vocab_size})", param, "invalid_value")
    return prompts


def _abort(f: Fleet, choices: list[Choice]) -> None:
    for choice in choices:
        if choice.submitted and not choice.finished:
            f.router.abort(choice.request_id)


def _complete(f: Fleet, out: Reply, events: queue.Queue) -> Response:
    by_id = {c.request_id: c for c in out.choices}
    try:
        while not all(c.finished for c in out.choices):
            try:
                event = events.get(timeout=NO_EVENT_TIMEOUT_S)
            except queue.Empty:
                raise ServingError(503, "the request timed out", None, "timeout") from None
            if isinstance(event, RequestError):
                by_id[event.request_id].finished = True
                raise _request_error(event)
            out.absorb(by_id[event.request_id], out.visible(event))
    finally:
        _abort(f, out.choices)  # on an error or timeout, the other choices stop too
    return Response(json.dumps(out.completion()), mimetype="application/json")


def _sse(f: Fleet, out: Reply, events: queue.Queue, ping_s: float) -> Generator[str, None, None]:
    by_id = {c.request_id: c for c in out.choices}
    client_left = False
    try:
        while not all(c.finished for c in out.choices):
            try:
                event = events.get(timeout=ping_s)
            except queue.Empty:
                if f.defences.heartbeat:  # off: not a byte while the request waits
                    yield ": ping\n\n"
                continue
            choice = by_id[event.request_id]
            if isinstance(event, RequestError):
                choice.finished = True
                yield _data(_request_error(event).body())
                break
            event = out.visible(event)
            entries = out.absorb(choice, event)
            # Ids whose text is still held back (a character split across tokens) go out too when asked for.
            ids = event.token_ids if out.req.return_token_ids else []
            if event.text or event.finished or entries or ids or not choice.started:
                text = event.text if choice.started else choice.echo_text + event.text
                body = out.chunk(choice, text, entries, event.finish_reason if event.finished else None, ids)
                if event.finished and event.times is not None:
                    body["servelab"] = server_timing(event.times)  # the server's figures for this choice
                yield _data(body)
        else:
            if out.req.include_usage:
                yield _data(out.usage_chunk())
        yield "data: [DONE]\n\n"
    except GeneratorExit:  # the client went away: a write failed at a yield
        client_left = True
        raise
    finally:  # the client went away, or one choice failed: stop the rest
        if client_left and not f.defences.cancel_on_disconnect:
            _run_on(f, out.choices)
        else:
            _abort(f, out.choices)


def _run_on(f: Fleet, choices: list[Choice]) -> None:
    """cancel_on_disconnect off: the scheduler never hears the client left; what its requests
    make from here on is counted as wasted, and they run to their end."""
    for choice in choices:
        if choice.submitted and not choice.finished:
            f.bus.client_gone(choice.request_id)


def _held(stream: Generator[str, None, None]) -> Iterator[str]:
    """SSE_FLUSH off: the stream's parts kept until it ends, then sent as one."""
    try:
        yield "".join(stream)
    finally:
        stream.close()  # a stream never read to its end still stops its requests


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _bearer_key() -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None


def request_credential() -> str | None:
    """The request's bearer key, else its page session's credential where the app issues them."""
    sessions: PageSessions | None = current_app.extensions.get("servelab_page_sessions")
    return _bearer_key() or (sessions.credential(request) if sessions is not None else None)


def _request_error(err: RequestError) -> ServingError:
    if err.param is not None:
        return ServingError(400, err.message, err.param, "invalid_value")
    return ServingError(503, err.message, None, "request_failed", 1)
