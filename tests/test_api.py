"""The OpenAI-compatible API on a real server process with real replicas: the official client,
a validation matrix, a disconnect storm, a replica killed mid-stream, overload and SIGTERM."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from typing import Any

import openai
import pytest

from engine import LLM, SamplingParams
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.integration

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server() -> ServerProcess:
    srv = ServerProcess("--replicas", "2", "--dtype", "float32", "--max-num-seqs", "32", api_keys=KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)


def stream_lines(port: int, body: dict[str, Any], on_first=None) -> list[str]:
    """POST a streaming request; returns the SSE lines. on_first(conn) may close it early."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request(
        "POST", "/v1/completions", json.dumps({"stream": True, **body}), {**AUTH, "Content-Type": "application/json"}
    )
    response = conn.getresponse()
    assert response.status == 200, response.read()
    lines = []
    while True:
        raw = response.readline()
        if not raw:
            break
        line = raw.decode().rstrip("\r\n")
        if not line:
            continue
        lines.append(line)
        if on_first and line.startswith("data: {") and on_first(conn):
            return lines
        if line == "data: [DONE]":
            break
    conn.close()
    return lines


def text_of(lines: list[str]) -> str:
    out = ""
    for line in lines:
        if line.startswith("data: {"):
            payload = json.loads(line[6:])
            assert "error" not in payload, payload
            out += "".join(c.get("text", "") for c in payload["choices"])
    return out


def metric(server: ServerProcess, name: str) -> float:
    _, text = server.request("GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing from /metrics")


def test_official_client_chat_and_completions(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count from 1 to 5."}], max_tokens=12, temperature=0
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 12
    assert chat.choices[0].finish_reason == "length"
    done = client.completions.create(model=MODEL, prompt="The days of the week are", max_tokens=8, temperature=0)
    assert done.usage.prompt_tokens > 0 and done.usage.completion_tokens == 8
    pieces, usage = [], None
    for event in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if event.usage:
            usage = event.usage
        pieces += [c.delta.content or "" for c in event.choices]
    assert "".join(pieces) and usage is not None and usage.completion_tokens == 10
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="The days of the week are", max_tokens=8, temperature=0, stream=True
        )
    )
    assert streamed == done.choices[0].text
    assert [m.id for m in client.models.list().data] == [MODEL]


BIG = "x" * (2 << 20)


def user(content: object) -> list[dict]:
    return [{"role": "user", "content": content}]


MATRIX = [
    ({"raw": b"{not json"}, 400, None),
    ({"raw": b"[1, 2]"}, 400, None),
    ({"body": {"model": MODEL}}, 400, "prompt"),
    ({"body": {"prompt": ""}}, 400, "prompt"),
    ({"body": {"prompt": ["a", 7]}}, 400, "prompt"),
    ({"body": {"prompt": [[1, 2], []]}}, 400, "prompt[1]"),
    ({"body": {"prompt": [[1, "x"], [2]]}}, 400, "prompt[0]"),
    ({"body": {"prompt": "hi", "max_tokens": 0}}, 400, "max_tokens"),
    ({"body": {"prompt": "hi", "max_tokens": -3}}, 400, "max_tokens"),
    ({"body": {"prompt": "hi", "max_tokens": "10"}}, 400, "max_tokens"),
    ({"body": {"prompt": "hi", "max_tokens": 9000}}, 400, "max_tokens"),
    ({"body": {"prompt": "hi", "temperature": -1}}, 400, "temperature"),
    ({"body": {"prompt": "hi", "top_p": 2}}, 400, "top_p"),
    ({"body": {"prompt": "hi", "n": 0}}, 400, "n"),
    ({"body": {"prompt": "hi", "n": 2, "best_of": 3}}, 400, "best_of"),
    ({"body": {"prompt": "hi", "logprobs": 21}}, 400, "logprobs"),
    ({"body": {"prompt": "hi", "logprobs": True}}, 400, "logprobs"),
    ({"body": {"prompt": "hi", "echo": "yes"}}, 400, "echo"),
    ({"body": {"prompt": "hi", "presence_penalty": 3}}, 400, "presence_penalty"),
    ({"body": {"prompt": "hi", "repetition_penalty": 0}}, 400, "repetition_penalty"),
    ({"body": {"prompt": "hi", "min_tokens": 20, "max_tokens": 4}}, 400, "min_tokens"),
    ({"body": {"prompt": "hi", "logit_bias": {"50": 5}}}, 400, "logit_bias"),
    ({"body": {"prompt": "hi", "suffix": "end"}}, 400, "suffix"),
    ({"body": {"prompt": "hi", "frobnicate": 1}}, 400, "frobnicate"),
    ({"body": {"prompt": "hi", "messages": []}}, 400, "messages"),
    ({"body": {"prompt": "hi", "stream": True, "stream_options": {"x": 1}}}, 400, "stream_options.x"),
    ({"body": {"prompt": "hi", "stream": "yes"}}, 400, "stream"),
    ({"body": {"prompt": "hi", "stop": [1]}}, 400, "stop"),
    ({"body": {"prompt": "hi", "priority": "high"}}, 400, "priority"),
    ({"body": {"prompt": "hi", "priority": 10**7}}, 400, "priority"),
    ({"body": {"prompt": "hi", "model": "gpt-4"}}, 404, "model"),
    ({"body": {"prompt": BIG}}, 413, None),
    ({"body": {"prompt": "hi"}, "headers": {}}, 401, None),
    ({"body": {"prompt": "hi"}, "headers": {"Authorization": "Bearer wrong"}}, 401, None),
    ({"chat": {"messages": "hello"}}, 400, "messages"),
    ({"chat": {}}, 400, "messages"),
    ({"chat": {"messages": []}}, 400, "messages"),
    ({"chat": {"messages": [{"role": "robot", "content": "hi"}]}}, 400, "messages[0].role"),
    ({"chat": {"messages": [{"role": "user", "content": None}]}}, 400, "messages[0].content"),
    (
        {"chat": {"messages": user([{"type": "image_url", "image_url": {"url": "x"}}])}},
        400,
        "messages[0].content[0].type",
    ),
    (
        {"chat": {"messages": user([{"type": "text", "text": "a"}, {"type": "input_audio"}])}},
        400,
        "messages[0].content[1].type",
    ),
    ({"chat": {"messages": user([{"type": "text"}])}}, 400, "messages[0].content[0].text"),
    ({"chat": {"messages": [{"role": "user", "content": "hi", "mood": "x"}]}}, 400, "messages[0].mood"),
    ({"chat": {"messages": user("hi"), "top_logprobs": 2}}, 400, "top_logprobs"),
    ({"chat": {"messages": user("hi"), "logprobs": True, "top_logprobs": 21}}, 400, "top_logprobs"),
    ({"chat": {"messages": user("hi"), "response_format": {"type": "json_object"}}}, 400, "response_format"),
    ({"chat": {"messages": user("hi"), "tools": [{"type": "function"}]}}, 400, "tools"),
    ({"chat": {"messages": user("hi"), "echo": True}}, 400, "echo"),
    ({"chat": {"messages": user("hi"), "prompt": "x"}}, 400, "prompt"),
]


@pytest.mark.parametrize(("case", "status", "param"), MATRIX)
def test_validation_matrix(server: ServerProcess, case: dict, status: int, param: str | None) -> None:
    path = "/v1/chat/completions" if "chat" in case else "/v1/completions"
    headers = case.get("headers", AUTH)
    got, payload = server.request("POST", path, case.get("body", case.get("chat")), headers, case.get("raw"))
    assert got == status, payload
    error = json.loads(payload)["error"]
    assert error["param"] == param and error["message"] and error["type"]
    assert "Traceback" not in payload.decode() and ".py" not in payload.decode()
    assert server.request("POST", "/v1/completions", {"prompt": "ok", "max_tokens": 1}, AUTH)[0] == 200


def test_unknown_route_is_an_openai_404(server: ServerProcess) -> None:
    status, payload = server.request("GET", "/v1/nothing-here")
    assert status == 404 and json.loads(payload)["error"]["code"] == "not_found"


def test_disconnect_storm(server: ServerProcess, llm_fp32: LLM, hf_reference: dict) -> None:
    prompts = [r["prompt_ids"] for r in hf_reference["prompts"] if len(r["prompt_ids"]) < 300]
    want = [o.text for o in llm_fp32.generate(prompts, SamplingParams(temperature=0, max_tokens=16))]
    results: dict[int, str] = {}

    def keep(i: int) -> None:
        results[i] = text_of(
            stream_lines(server.port, {"prompt": prompts[i % len(prompts)], "max_tokens": 16, "temperature": 0})
        )

    def drop(i: int) -> None:
        body = {"prompt": prompts[i % len(prompts)], "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
        stream_lines(server.port, body, on_first=lambda conn: conn.close() or True)

    threads = [threading.Thread(target=keep, args=(i,)) for i in range(30)]
    threads += [threading.Thread(target=drop, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(results) == 30
    for i, text in results.items():
        assert text == want[i % len(prompts)], i
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and (
        metric(server, "vllm:num_requests_running") or metric(server, "vllm:kv_cache_usage_perc")
    ):
        time.sleep(0.1)
    assert metric(server, "vllm:num_requests_running") == 0
    assert metric(server, "vllm:kv_cache_usage_perc") == 0
    assert metric(server, "servelab_wasted_tokens_total") > 0


def test_sigkill_one_replica_mid_stream(server: ServerProcess) -> None:
    replicas = server.children()
    assert len(replicas) == 2
    outcomes: list[list[str]] = []

    def run(i: int) -> None:
        outcomes.append(
            stream_lines(
                server.port, {"prompt": [200 + i] * 20, "max_tokens": 150, "temperature": 0, "ignore_eos": True}
            )
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    os.kill(replicas[0], signal.SIGKILL)
    killed = time.monotonic()
    while (
        time.monotonic() - killed < 2.0
        and json.loads(server.request("GET", "/ready")[1])["replicas"].get("failed") != 1
    ):
        time.sleep(0.05)
    states = json.loads(server.request("GET", "/ready")[1])["replicas"]
    assert states == {"ready": 1, "failed": 1}, f"{states} 2 s after SIGKILL: a dead replica is failed within 2 s"
    assert 'servelab_replicas{state="failed"} 1' in server.request("GET", "/metrics")[1].decode()
    for t in threads:
        t.join(180)
    errored = [o for o in outcomes if any('"error"' in line for line in o)]
    completed = [o for o in outcomes if not any('"error"' in line for line in o)]
    assert errored and completed
    assert all(o[-1] == "data: [DONE]" for o in outcomes)
    assert all(json.loads(o[-2][6:])["choices"][0]["finish_reason"] == "length" for o in completed)
    status, _ = server.request("POST", "/v1/completions", {"prompt": "still serving", "max_tokens": 4}, AUTH)
    assert status == 200


def test_overload_then_sigterm_drains() -> None:
    srv = ServerProcess(
        "--replicas", "1", "--max-num-seqs", "2", "--queue-cap", "4", "--sse-ping-s", "0.2"
    )
    try:
        results: list[tuple[int, dict]] = []

        def fire(i: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
            conn.request(
                "POST",
                "/v1/completions",
                json.dumps({"prompt": [300 + i] * 30, "max_tokens": 8, "ignore_eos": True}),
                {"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            results.append(
                (response.status, {"retry": response.getheader("Retry-After"), "body": json.loads(response.read())})
            )

        threads = [threading.Thread(target=fire, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        refused = [r for s, r in results if s == 429]
        served = [r for s, r in results if s == 200]
        assert refused and served and len(refused) + len(served) == 20
        retries = {int(r["retry"]) for r in refused}
        assert len(retries) > 1 and min(retries) >= 1
        assert all(r["body"]["usage"]["completion_tokens"] == 8 for r in served)

        # A stream that waits behind two long requests hears `: ping` until its first token. Long
        # enough on any CPU: 40 tokens each were done 0.1 s after the 0.3 s wait on a fast one.
        blockers = [
            threading.Thread(
                target=stream_lines, args=(srv.port, {"prompt": [7] * 20, "max_tokens": 200, "ignore_eos": True})
            )
            for _ in range(2)
        ]
        for t in blockers:
            t.start()
        time.sleep(0.3)
        waited = stream_lines(srv.port, {"prompt": [8] * 20, "max_tokens": 4, "ignore_eos": True})
        assert waited[0] == ": ping" and waited[-1] == "data: [DONE]"
        for t in blockers:
            t.join(60)

        replicas = srv.children()
        streams: list[list[str]] = []
        runner = [
            threading.Thread(
                target=lambda i=i: streams.append(
                    stream_lines(srv.port, {"prompt": [400 + i] * 20, "max_tokens": 60, "ignore_eos": True})
                )
            )
            for i in range(2)
        ]
        for t in runner:
            t.start()
        time.sleep(1.0)
        srv.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        time.sleep(0.2)
        assert srv.request("GET", "/ready")[0] == 503
        assert srv.request("POST", "/v1/completions", {"prompt": "late", "max_tokens": 2})[0] == 503
        for t in runner:
            t.join(60)
        assert len(streams) == 2 and all(s[-1] == "data: [DONE]" and '"length"' in s[-2] for s in streams)
        srv.proc.wait(30 + 10)
        took = time.monotonic() - sent
        assert took < 40, f"SIGTERM to exit took {took:.1f} s: within the 30 s drain timeout + 10 s"
        assert srv.proc.returncode == 0
        assert not any(os.path.exists(f"/proc/{pid}") for pid in replicas)
    finally:
        srv.stop()
