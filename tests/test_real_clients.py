"""Real clients, unchanged, against a real server process: the official openai SDK (typed content
parts, logprobs, echo, n, prompt batches), the request bodies guidellm and `vllm bench serve`
send, and guidellm itself at a constant rate on both endpoints."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.export_tokenizer import export_tokenizer
from engine import LLM, SamplingParams
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.integration

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server() -> ServerProcess:
    srv = ServerProcess("--replicas", "1", "--dtype", "float32", "--max-num-seqs", "32")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def sse(port: int, path: str, body: dict[str, Any], close_after_first: bool = False) -> list[dict[str, Any]]:
    """POST a streaming request; the JSON payloads of its data lines ([DONE] checked, not returned)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, json.dumps({"stream": True, **body}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    payloads, done = [], False
    while raw := response.readline():
        line = raw.decode().rstrip("\r\n")
        if line == "data: [DONE]":
            done = True
            break
        if line.startswith("data: "):
            payloads.append(json.loads(line[6:]))
            if close_after_first:
                conn.close()
                return payloads
    conn.close()
    assert done
    return payloads


def metric(server: ServerProcess, name: str) -> float:
    text = server.request("GET", "/metrics")[1].decode()
    return next(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + "{", name + " "))
    )


def test_typed_content_parts_join_as_one_message(client: openai.OpenAI) -> None:
    parts = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "You answer in one word."}]},
            {"role": "user", "name": "ada", "content": [{"type": "text", "text": "Name a color."}, {"type": "text", "text": "Only one."}]},
        ],
        max_tokens=8,
        temperature=0,
        user="student-1",
        metadata={"lesson": "1"},
        store=False,
    )  # fmt: skip
    plain = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Name a color.\nOnly one."},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    ask = {"model": MODEL, "messages": user("What is the capital of France?"), "max_tokens": 8, "temperature": 0}
    chat = client.chat.completions.create(**ask, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 8
    for entry in content:  # greedy: the chosen token is the best of its top logprobs
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.logprob == max(t.logprob for t in entry.top_logprobs) <= 0
    spelled = b"".join(bytes(e.bytes) for e in content).decode()  # the EOS token is listed, as usage counts it
    assert spelled.removesuffix("<|im_end|>") == chat.choices[0].message.content
    streamed = []
    for event in client.chat.completions.create(**ask, logprobs=True, top_logprobs=3, stream=True):
        for choice in event.choices:
            streamed += choice.logprobs.content if choice.logprobs else []
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(streamed, content))
    assert client.chat.completions.create(**ask).choices[0].logprobs is None


def test_completions_echo_with_logprobs(client: openai.OpenAI, llm_fp32: LLM) -> None:
    prompt = "The capital of France is"
    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=2)
    choice, lp, num_prompt = done.choices[0], done.choices[0].logprobs, done.usage.prompt_tokens
    assert choice.text.startswith(prompt) and len(lp.tokens) == num_prompt + done.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for token, value, top in zip(lp.tokens[num_prompt:], lp.token_logprobs[num_prompt:], lp.top_logprobs[num_prompt:]):
        assert top[token] == value == max(top.values())
    offline = llm_fp32.generate(prompt, SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2))[0]
    assert all(abs(a - b.logprob) < 1e-4 for a, b in zip(lp.token_logprobs[1:num_prompt], offline.prompt_logprobs[1:]))
    chunks = sse(client_port(client), "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 2})  # fmt: skip
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice.text
    assert [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]] == lp.tokens
    # max_tokens 0 with echo scores the prompt alone (eval harnesses' loglikelihood requests).
    scored = client.completions.create(model=MODEL, prompt=[prompt, prompt], max_tokens=0, echo=True, logprobs=1)
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == 2 * num_prompt
    for c in scored.choices:
        assert c.text == prompt and c.logprobs.tokens == lp.tokens[:num_prompt] and c.finish_reason == "length"
        assert all(abs(a - b) < 1e-4 for a, b in zip(c.logprobs.token_logprobs[1:], lp.token_logprobs[1:num_prompt]))


def client_port(client: openai.OpenAI) -> int:
    return int(str(client.base_url).split(":")[-1].split("/")[0])


def test_n_samples_and_prompt_batches(client: openai.OpenAI) -> None:
    prompt = "Three facts about the moon:"
    three = client.completions.create(model=MODEL, prompt=prompt, n=3, max_tokens=8, temperature=0)
    assert [c.index for c in three.choices] == [0, 1, 2] and len({c.text for c in three.choices}) == 1
    one = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert three.choices[0].text == one.choices[0].text
    # Usage counts every sample's tokens, and the prompt once.
    assert three.usage.completion_tokens == 24 and three.usage.prompt_tokens == one.usage.prompt_tokens
    sampled = client.chat.completions.create(
        model=MODEL, messages=user("Invent a name for a cat."), n=3, temperature=1.0, seed=5, max_tokens=12
    )
    assert len({c.message.content for c in sampled.choices}) > 1  # independent samples, not one copied
    # Greedy margins >= 0.3 nats over these 6 tokens: batched or alone, the same text.
    prompts = ["Three facts about the moon:", "One, two, three, four,", "Water boils at a temperature of"]
    batch = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    singles = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0) for p in prompts]
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [s.choices[0].text for s in singles]
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert batch.usage.completion_tokens == 18
    body = {"prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0, "stream_options": {"include_usage": True}}
    chunks = sse(client_port(client), "/v1/completions", body)
    texts: dict[int, str] = {}
    for c in chunks:
        for ch in c["choices"]:
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
    assert texts == {i: batch.choices[i // 2].text for i in range(6)}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 36


def test_disconnect_aborts_every_choice(server: ServerProcess) -> None:
    body = {"prompt": ["Count to a thousand:", "List every prime:"], "n": 3, "max_tokens": 1500, "ignore_eos": True}
    first = sse(server.port, "/v1/completions", body, close_after_first=True)
    assert first and first[0]["choices"][0]["text"] is not None
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and (
        metric(server, "vllm:num_requests_running") or metric(server, "vllm:kv_cache_usage_perc")
    ):
        time.sleep(0.1)
    assert metric(server, "vllm:num_requests_running") == 0 and metric(server, "vllm:kv_cache_usage_perc") == 0


# What these clients put in a body (guidellm 0.8.1's request_handlers.py, vLLM 0.32's
# benchmarks/lib/endpoint_request_func.py, the openai SDK's create()): all known, all served.
ROUTINE = [
    ("/v1/chat/completions", {"model": MODEL, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
      "max_completion_tokens": 3, "stop": None, "ignore_eos": True, "messages": user([{"type": "text", "text": "hi"}])}),
    ("/v1/completions", {"model": MODEL, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
      "max_tokens": 3, "stop": None, "ignore_eos": True, "prompt": "hi"}),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "repetition_penalty": 1.0, "max_tokens": 3, "logprobs": None,
      "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "top_k": -1, "top_p": 1.0, "min_p": 0.0}),
    ("/v1/chat/completions", {"model": MODEL, "messages": user([{"type": "text", "text": "hi"}]), "max_completion_tokens": 3,
      "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}),
    ("/v1/chat/completions", {"model": MODEL, "messages": user("hi"), "max_tokens": 3, "n": 1, "user": "u", "metadata": {"a": "b"},
      "store": False, "service_tier": "auto", "parallel_tool_calls": True, "tool_choice": "none", "response_format": {"type": "text"},
      "presence_penalty": 0.1, "frequency_penalty": 0.1, "seed": 1, "stop": ["\n\n"], "top_logprobs": None, "min_tokens": 1}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body"), ROUTINE)
def test_routine_client_bodies_are_served(server: ServerProcess, path: str, body: dict[str, Any]) -> None:
    if body.get("stream"):
        chunks = sse(server.port, path, body)
        assert chunks[-1]["usage"]["completion_tokens"] == 3
    else:
        status, payload = server.request("POST", path, body)
        assert status == 200, payload


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_guidellm_constant_rate(server: ServerProcess, tokenizer_dir: Path, tmp_path: Path, endpoint: str) -> None:
    out = tmp_path / "guidellm.json"
    cmd = [sys.executable, "-m", "guidellm", "run",
           "--backend", f"kind=openai_http,target={server.base_url},request_format={endpoint}",
           "--profile", "kind=constant,rate=2", "--constraint", "kind=max_duration,seconds=8",
           "--tokenizer", f"kind=hf_auto,model={tokenizer_dir}",
           "--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=8",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    # No request may fail; those still running at the 8 s mark are cancelled (incomplete), which
    # says nothing about the API, so only "some completed" is asked of them (no latency bound).
    assert totals["errored"] == 0 and totals["successful"] > 0, totals
    for name in ("time_to_first_token_ms", "inter_token_latency_ms"):
        stats = metrics[name]["successful"]
        assert stats["count"] > 0 and stats["median"] > 0, (name, stats)
    print(
        endpoint,
        {k: round(metrics[k]["successful"]["median"], 1) for k in ("time_to_first_token_ms", "inter_token_latency_ms")},
    )
