"""The app's own OpenAI API in remote mode (issue 17): a streaming pass-through to the remote
server, so the pages (the prompt box, a class flood) stay as they are.

POST /v1/completions and /v1/chat/completions go to the remote as they came, with the remote's
API key in place of the browser's (none); the remote's status, Retry-After and error body come
back as they are, and a stream is relayed chunk by chunk. An error the remote gives (or a
remote that cannot be reached: 502, an OpenAI-style error naming it) also goes to the event
timeline, rate-limited (engine/lab/remote/remote_errors.py). GET /v1/models passes through too;
/health and /ready answer for the lab (it stays usable while the remote is down, and says so in
/ready's body); /metrics is the lab's clients' counters (the remote's own are at its URL)."""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException

from engine.errors import ServingError
from engine.lab.remote.remote_backend import auth_headers, connection
from engine.lab.remote.remote_lab import RemoteLab
from engine.lab.remote.user_streams import user_of
from web.openai_api import MAX_BODY_BYTES, error_response, request_credential
from web.page_session import PageSessions

log = logging.getLogger("servelab.api")

REMOTE_TIMEOUT_S = 600.0  # a stream's longest silence before the pass-through gives up
PASSED_HEADERS = ("content-type", "retry-after", "cache-control", "x-request-id")

remote_api = Blueprint("remote_api", __name__)


def create_remote_api_app(lab: RemoteLab, api_keys: list[str] | None = None) -> Flask:
    """The Flask app of the remote lab: the pass-through API; app.py adds pages and sockets.
    api_keys: the keys this app's own /v1/* asks for (SERVELAB_API_KEYS, as in local mode), so
    the remote's key is not lent to whoever reaches the app; none: open, a localhost default."""
    root = Path(__file__).resolve().parent.parent
    app = Flask(__name__, static_folder=str(root / "static"), template_folder=str(root / "templates"))
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["SERVELAB_API_KEYS"] = list(api_keys or [])
    app.extensions["servelab_remote"] = lab
    app.register_blueprint(remote_api)
    return app


def lab() -> RemoteLab:
    return current_app.extensions["servelab_remote"]


@remote_api.app_errorhandler(ServingError)
def _api_error(err: ServingError) -> Response:
    return error_response(err)


@remote_api.app_errorhandler(HTTPException)
def _http_error(err: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(err.code or 0)
    message = "the request body is too large" if err.code == 413 else (err.description or err.name)
    return error_response(ServingError(err.code or 500, message, None, code))


@remote_api.app_errorhandler(Exception)
def _unexpected(err: Exception) -> Response:
    log.exception("unhandled error")  # the details go to the log, never to the client
    return error_response(ServingError(500, "internal server error", None, "internal_error"))


@remote_api.get("/health")
def health() -> Response:
    return Response(json.dumps({"status": "ok"}), mimetype="application/json")


@remote_api.get("/ready")
def ready() -> Response:
    remote = lab()
    body = {
        "ready": True,
        "remote": {
            "url": remote.config.base_url,
            "reachable": remote.info.reachable,
            "status": remote.status,
            "problems": [p for p in remote.problems.values() if p],
        },
    }
    return Response(json.dumps(body), mimetype="application/json")


@remote_api.get("/metrics")
def metrics() -> Response:
    return Response("\n".join(lab().traffic.counts.prometheus_lines()) + "\n", mimetype="text/plain; version=0.0.4")


@remote_api.get("/v1/models")
def models() -> Response:
    return _pass("GET", "/v1/models", b"")


@remote_api.post("/v1/completions")
def completions() -> Response:
    return _pass("POST", "/v1/completions", request.get_data(cache=False))


@remote_api.post("/v1/chat/completions")
def chat_completions() -> Response:
    return _pass("POST", "/v1/chat/completions", request.get_data(cache=False))


def _pass(method: str, path: str, body: bytes) -> Response:
    keys = current_app.config["SERVELAB_API_KEYS"]
    credential = request_credential()
    sessions: PageSessions | None = current_app.extensions.get("servelab_page_sessions")
    page = credential is not None and sessions is not None and sessions.is_page_credential(credential)
    if keys and credential not in keys and not page:
        raise ServingError(401, "missing or invalid API key", None, "unauthorized")
    remote = lab()
    url = remote.config.base_url + path
    conn, target = connection(url, REMOTE_TIMEOUT_S)
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json"), "Accept": "*/*"}
    try:
        conn.request(method, target, body=body or None, headers=headers | auth_headers(remote.config.api_key))
        sock = conn.sock  # before the response: http.client may hand it to the response
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException) as err:
        conn.close()
        remote.errors.report("the app's API", None, None, f"{url}: {type(err).__name__}: {err}")
        raise ServingError(
            502, f"the remote server at {remote.config.base_url} is unreachable: {err}", None, "remote_unreachable"
        ) from None
    passed = {name: value for name, value in resp.getheaders() if name.lower() in PASSED_HEADERS}
    if resp.status >= 400:
        data = resp.read()
        conn.close()
        remote.errors.report(
            "the app's API", resp.status, resp.getheader("Retry-After"), data[:2000].decode("utf-8", "replace")
        )
        return Response(data, status=resp.status, headers=passed)
    if "text/event-stream" in (resp.getheader("Content-Type") or ""):
        passed["X-Accel-Buffering"] = "no"
        user = user_of(body)
        if user is not None and sock is not None:  # a class's student: cut when they leave (cancel_user)
            remote.user_streams.add(user, sock)
        relay = _relay(conn, resp, lambda: user is not None and remote.user_streams.discard(user, sock))
        return Response(relay, status=resp.status, headers=passed, direct_passthrough=True)
    data = resp.read()
    conn.close()
    return Response(data, status=resp.status, headers=passed)


def _relay(
    conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, on_end: Callable[[], object]
) -> Iterator[bytes]:
    """The remote's stream as it comes (read1: whatever has arrived, chunked encoding undone); a
    browser that leaves closes the generator, and with it the remote's connection: the remote
    sees the hang-up and cancels, as a client of its own would make it."""
    try:
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                return
            yield chunk
    except (OSError, http.client.HTTPException):
        # The remote went away mid-stream: end it in-band, as the API's contract has it.
        error = {
            "error": {
                "message": "the remote server closed the stream",
                "type": "remote_error",
                "param": None,
                "code": "remote_stream_cut",
            }
        }
        yield f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()
    finally:
        on_end()
        conn.close()
