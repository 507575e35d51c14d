"""The remote backend's edges (issue 17), without a model: bad flags and URLs exit 2 with one line;
a server that is unreachable, refuses the key, is not OpenAI-compatible or has no metrics under
known names is named as such, and the lab stays usable; levers the remote owns are refused by
name; the app's API passes the remote's status, Retry-After and error body through; a flood of
429s is summarised in the timeline. The "servers" here are real HTTP servers on free ports that
answer as such a bad remote would."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from flask import Response, request

import app as app_module
from engine.clock import VirtualClock
from engine.errors import InvalidParamError
from engine.lab.remote.remote_backend import RemoteConfig, probe
from engine.lab.remote.remote_errors import RemoteErrors
from engine.lab.remote.remote_lab import RemoteLab
from engine.lab.remote.remote_levers import REMOTE_LEVERS
from engine.serving.telemetry.events import EventLog
from tests.support.server_process import free_port
from web.page_session import COOKIE, HEADER, PageSessions
from web.remote_api import create_remote_api_app

pytestmark = pytest.mark.unit

MODELS = json.dumps(
    {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}]}
)
HTML = "<!doctype html><html><body>Welcome to nginx!</body></html>"
Route = tuple[int, dict[str, str], str]


class CannedServer:
    """A real HTTP server whose routes answer fixed responses (a remote that misbehaves)."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.bodies: list[bytes] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                owner.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self._answer()

            def _answer(self) -> None:
                status, headers, body = owner.routes.get(self.path, (404, {}, '{"error": {"message": "no route"}}'))
                data = body.encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def canned() -> Iterator[CannedServer]:
    server = CannedServer({})
    yield server
    server.close()


@pytest.mark.parametrize(
    "argv, words",
    [(["--backend", "remote"], "needs --base-url"),
     (["--backend", "remote", "--base-url", "ftp://gpu:8000"], "must be an http:// or https:// URL"),
     (["--backend", "remote", "--base-url", "http://gpu:port"], "bad port"),
     (["--backend", "remote", "--base-url", "http://127.0.0.1:9", "--metrics-url", "gpu/metrics"], "--metrics-url"),
     (["--backend", "remote", "--base-url", "http://127.0.0.1:9", "--max-num-seqs", "8"], "--max-num-seqs belongs to the remote")],
)  # fmt: skip
def test_bad_flags_exit_2_with_one_line(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert app_module.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_config_strips_v1_and_defaults_the_metrics_url() -> None:
    config = RemoteConfig.from_args("http://gpu:8000/v1/", None, "sk-1")
    assert (config.base_url, config.metrics_url, config.api_key) == (
        "http://gpu:8000",
        "http://gpu:8000/metrics",
        "sk-1",
    )
    assert RemoteConfig.from_args("https://gpu", "http://gpu:9090/m").metrics_url == "http://gpu:9090/m"


def test_probe_names_what_is_wrong(canned: CannedServer) -> None:
    config = RemoteConfig.from_args(canned.url)
    canned.routes["/v1/models"] = (200, {"Content-Type": "text/html"}, HTML)
    info = probe(config)
    assert (
        info.reachable
        and info.model is None
        and "not OpenAI-compatible" in info.problem
        and "text/html" in info.problem
    )
    canned.routes["/v1/models"] = (401, {"Content-Type": "application/json"}, '{"error": {"message": "bad key"}}')
    assert "refused the API key: 401 Unauthorized: bad key" in probe(config).problem
    canned.routes["/v1/models"] = (200, {"Content-Type": "application/json"}, MODELS)
    assert (probe(config).model, probe(config).max_model_len, probe(config).problem) == ("m", 4096, None)
    down = probe(RemoteConfig.from_args(f"http://127.0.0.1:{free_port()}"))
    assert not down.reachable and down.problem.startswith("unreachable:")


def test_lab_over_a_bad_remote_stays_usable_and_says_why(canned: CannedServer) -> None:
    canned.routes["/v1/models"] = (200, {"Content-Type": "text/html"}, HTML)
    canned.routes["/metrics"] = (200, {"Content-Type": "text/html"}, HTML)
    lab = RemoteLab(RemoteConfig.from_args(canned.url))
    try:
        lab.poller.tick()
        state = lab.live_state()
        assert state.status == "not OpenAI-compatible" and state.remote is not None
        assert any("not Prometheus text" in p for p in state.remote.problems)
        assert state.to_json()["remote"]["problems"] == state.remote.problems  # the page's JSON
        events = [e["message"] for e in lab.events.recent("remote")]
        assert any("not OpenAI-compatible" in m for m in events) and any("not Prometheus text" in m for m in events)
        # Metrics under other names: named, and the charts' keys are None (the clients' still there).
        canned.routes["/v1/models"] = (200, {"Content-Type": "application/json"}, MODELS)
        canned.routes["/metrics"] = (200, {"Content-Type": "text/plain"}, "http_requests_total 3\n")
        lab.next_probe = 0.0
        lab.poller.tick()
        assert lab.status == "serving (no metrics)" and lab.info.model == "m"
        snap = lab.snapshot(lab.compose())
        assert snap["running"] is None and "client_ttft_p50" in snap and snap["executor"] == "remote"
        assert any(
            "none of vLLM's or SGLang's metric names (http_requests_total)" in p
            for p in snap["lab"]["remote"]["problems"]
        )
        assert lab.label() == f"remote: vLLM at {canned.url}, model m"  # owned_by names it when metrics cannot
        with pytest.raises(InvalidParamError) as err:  # max_model_len 4096: 3000 x 1.5 + 64 x 1.5 does not fit
            lab.set_levers({"prompt_tokens": 3000})
        assert err.value.param == "prompt_tokens" and "max_model_len is 4096" in err.value.message
    finally:
        lab.stop()


def test_levers_the_remote_owns_are_refused_by_name() -> None:
    lab = RemoteLab(RemoteConfig.from_args(f"http://127.0.0.1:{free_port()}"))
    try:
        with pytest.raises(InvalidParamError) as err:
            lab.set_levers({"request_rate": 3, "max_num_seqs": 8})
        assert err.value.param == "max_num_seqs" and "belongs to the remote server" in err.value.message
        assert lab.levers["request_rate"] == 1.0  # nothing applied
        with pytest.raises(InvalidParamError) as err:
            lab.set_levers({"executor": "sim"})
        assert err.value.param == "executor"
        result = lab.set_levers({"request_rate": 3, "stream_flush": False, "max_num_seqs": lab.levers["max_num_seqs"]})
        assert result.changed == {"request_rate": 3.0, "stream_flush": False}
        assert lab.proxy_settings().stream_flush is False
        assert set(lab.readonly()) == {k for k in lab.levers if k not in (*REMOTE_LEVERS, "executor")}
    finally:
        lab.stop()


def test_pass_through_keeps_the_remotes_status_retry_after_and_body(canned: CannedServer) -> None:
    refusal = '{"error": {"message": "the request queue is full", "type": "rate_limit", "code": "queue_full"}}'
    canned.routes["/v1/chat/completions"] = (429, {"Content-Type": "application/json", "Retry-After": "3"}, refusal)
    lab = RemoteLab(RemoteConfig.from_args(canned.url, api_key="sk-remote"))
    try:
        client = create_remote_api_app(lab).test_client()
        answer = client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert (
            answer.status_code == 429
            and answer.headers["Retry-After"] == "3"
            and answer.get_data(as_text=True) == refusal
        )
        assert json.loads(canned.bodies[-1]) == {"model": "m", "messages": []}  # the body went as it came
        events = lab.events.recent("remote")
        assert (
            events[-1]["status"] == 429
            and "429 Too Many Requests: the request queue is full (Retry-After: 3 s)" in events[-1]["message"]
        )
        locked = create_remote_api_app(lab, ["class-key"]).test_client()  # SERVELAB_API_KEYS: the app's own
        assert locked.post("/v1/chat/completions", json={}).status_code == 401
        ok = locked.post("/v1/chat/completions", json={}, headers={"Authorization": "Bearer class-key"})
        assert ok.status_code == 429  # let through to the remote, whose answer comes back
        # The app's own pages pass by their session (web/page_session.py), as in local mode.
        sessions = locked.application.extensions["servelab_page_sessions"] = PageSessions()
        with locked.application.test_request_context("/lab"):
            cookie = sessions.issue(request, Response("", mimetype="text/html")).headers["Set-Cookie"]
        locked.set_cookie(COOKIE, cookie.split(";", 1)[0].split("=", 1)[1])
        assert locked.post("/v1/chat/completions", json={}).status_code == 401  # no page header
        assert locked.post("/v1/chat/completions", json={}, headers={HEADER: "1"}).status_code == 429
        canned.close()
        answer = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert answer.status_code == 502 and answer.get_json()["error"]["code"] == "remote_unreachable"
    finally:
        lab.stop()


def test_a_flood_of_429s_is_summarised() -> None:
    clock = VirtualClock(100.0)
    events = EventLog(clock)
    errors = RemoteErrors(events, clock, summary_s=2.0)
    for i in range(50):
        errors.report("the lab's clients", 429, str(1 + i % 3), '{"error": {"message": "queue full"}}')
        clock.advance(0.01)
    errors.report("the app's API", 401, None, '{"error": {"message": "bad key"}}')
    assert [e["status"] for e in events.recent()] == [429, 401]  # one event per kind so far
    clock.advance(2.0)
    errors.flush()
    last = events.recent()[-1]
    assert (
        last["count"] == 49
        and "and 49 more 429s from the remote in 2 s (the lab's clients, Retry-After 1-3 s)" in last["message"]
    )
    assert errors.counts == {"429": 50, "401": 1}
