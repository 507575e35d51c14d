"""The load generator: `vllm bench serve`'s traffic and metrics, on stdlib threads.

Arrivals are gamma-distributed (Poisson at burstiness 1), requests are random token ids of
seeded lengths, and each request runs on its own thread against a target: the in-process
Router, or any OpenAI-compatible server over HTTP with streaming. Metrics live in
loadgen_metrics.

    python -m engine.serving.load.loadgen --base-url http://127.0.0.1:8000 --model NAME --rate 4 \\
        --num-requests 50 --prompt-tokens 200 --output-tokens 64 --slo ttft=1000 --json out.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import random
import socket
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from engine.clock import WALL_CLOCK, SleepingClock
from engine.sampling_params import SamplingParams
from engine.serving.load.loadgen_metrics import RequestRecord, format_table, summarize
from engine.serving.load.prompt_mix import VOCAB, Conversation, draw_length
from engine.serving.replicas.messages import RequestError
from engine.serving.routing.router import AdmissionError, Router

__all__ = [
    "VOCAB",
    "HttpTarget",
    "LoadRequest",
    "RequestRecord",
    "RouterTarget",
    "Target",
    "arrival_times",
    "draw_length",
    "make_requests",
    "run_load",
    "summarize",
]

# The serving stack's wall clock: a client's timestamps and the server's read the same time.
now = WALL_CLOCK.now


def arrival_gap(rng: random.Random, rate: float, burstiness: float) -> float:
    """Seconds to the next arrival: Gamma(shape=burstiness, scale=1/(rate*burstiness)), mean 1/rate
    whatever the burstiness (1 is Poisson, below 1 bursty, inf evenly spaced). The one arrival
    process: benchmarks, the live flood and the simulated lab all draw their gaps here."""
    if burstiness == float("inf"):
        return 1.0 / rate
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_times(rate: float, num_requests: int, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send offsets in seconds from the start, as vLLM's get_request computes them: gaps drawn
    from Gamma(shape=burstiness, scale=1/(rate*burstiness)) (mean 1/rate whatever the
    burstiness), summed, then rescaled so the last one lands at num_requests/rate, which keeps
    the offered load equal across seeds. rate=inf sends everything at once."""
    if num_requests <= 0:
        return []
    if rate == float("inf"):
        return [0.0] * num_requests
    if not rate > 0 or not burstiness > 0:
        raise ValueError("rate and burstiness must be positive")
    rng = random.Random(seed)
    offsets, total = [], 0.0
    for _ in range(num_requests):
        total += arrival_gap(rng, rate, burstiness)
        offsets.append(total)
    scale = (num_requests / rate) / total
    return [t * scale for t in offsets]


@dataclass
class LoadRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    priority: int = 0  # vLLM's request priority: lower is served first (the lab's batch jobs: 1)
    # A conversation's turn (engine/serving/load/prompt_mix.py): its answer's ids continue it, so the
    # server is asked for them (vLLM's return_token_ids) and the record keeps them.
    conversation: Conversation | None = None


def make_requests(
    num_requests: int, prompt_tokens: int, output_tokens: int, range_ratio: float = 0.5, seed: int = 0
) -> list[LoadRequest]:
    """vLLM's random dataset: lengths uniform in [mean*(1-r), mean*(1+r)] (at least 1) and
    random token ids, so prompts share no prefix and the prefix cache cannot flatter a run."""
    if not 0 <= range_ratio < 1:
        raise ValueError("range_ratio must be in [0, 1)")
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:8]  # ids stay unique if one router serves several runs
    requests = []
    for i in range(num_requests):
        n_in, n_out = draw_length(rng, prompt_tokens, range_ratio), draw_length(rng, output_tokens, range_ratio)
        ids = [rng.randrange(*VOCAB) for _ in range(n_in)]
        requests.append(LoadRequest(f"load-{run}-{i}", ids, n_out))
    return requests


class Target(Protocol):
    def send(self, request: LoadRequest, record: RequestRecord, stop: threading.Event) -> None:
        """Run one request to its end, writing what happens into record; give up once stop is set."""
        ...


class RouterTarget:
    """In process: Router.submit and its event queue, with no HTTP in the way."""

    def __init__(self, router: Router, api_key: str | None = None) -> None:
        self.router = router
        self.api_key = api_key

    def send(self, request: LoadRequest, record: RequestRecord, stop: threading.Event) -> None:
        params = SamplingParams(temperature=0, max_tokens=request.max_tokens, ignore_eos=True)
        record.start(now())
        try:
            events = self.router.submit(
                request.request_id, request.prompt_token_ids, params, api_key=self.api_key, priority=request.priority
            )
        except AdmissionError as err:
            record.reject(err.status, err.retry_after_s, f"{err.reason}: {err.message}")
            return
        while True:
            try:
                event = events.get(timeout=0.05)
            except queue.Empty:
                if stop.is_set():  # the run is over: free the replica's slot
                    self.router.abort(request.request_id)
                    return
                continue
            t = now()
            if isinstance(event, RequestError):
                record.fail(event.message)
                return
            if event.token_ids:
                record.token(t, len(event.token_ids), event.token_ids)
            if event.finished:
                record.done()
                return


class HttpTarget:
    """An OpenAI-compatible server: streaming POST /v1/completions over http.client."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        self.https = url.scheme == "https"
        self.host, self.port = url.hostname, url.port
        self.path = url.path.rstrip("/") + "/v1/completions"
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s

    def body(self, request: LoadRequest) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": request.prompt_token_ids,  # token arrays need no tokenizer on either side
            "max_tokens": request.max_tokens,
            "temperature": 0,
            "ignore_eos": True,  # every request generates exactly max_tokens, as in vLLM's bench
            "stream": True,
            "stream_options": {"include_usage": True},
        } | ({"priority": request.priority} if request.priority else {}) | (
            {"return_token_ids": True} if request.conversation is not None else {}
        )

    def send(self, request: LoadRequest, record: RequestRecord, stop: threading.Event) -> None:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout_s)
        finished = threading.Event()
        # A blocked read can't see `stop`; shutting the socket from outside unblocks it.
        threading.Thread(target=_hang_up_on_stop, args=(conn, stop, finished), daemon=True).start()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            record.start(now())
            conn.request("POST", self.path, json.dumps(self.body(request)), headers)
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read(2000).decode("utf-8", "replace")
                if resp.status == 429:
                    record.reject(429, _retry_after(resp.getheader("Retry-After")), text)
                else:
                    record.fail(f"HTTP {resp.status}: {text}", resp.status)
                return
            self._read_stream(resp, record)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            record.fail("stopped at max_duration" if stop.is_set() else f"{type(exc).__name__}: {exc}")
        finally:
            finished.set()
            conn.close()

    @staticmethod
    def _read_stream(resp: http.client.HTTPResponse, record: RequestRecord) -> None:
        usage_tokens = None
        for raw in resp:  # one SSE line at a time; http.client undoes the chunked encoding
            t = now()
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):  # blank separators, ':' pings, event:/id: fields
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                record.done(usage_tokens)
                return
            chunk = json.loads(data)
            if "error" in chunk:
                error = chunk["error"]
                record.fail(error.get("message", str(error)) if isinstance(error, dict) else str(error))
                return
            choices = chunk.get("choices") or []
            ids = choices[0].get("token_ids") if choices else None  # asked for with return_token_ids
            ids = ids if isinstance(ids, list) else None
            if choices and choices[0].get("text"):
                record.token(t, 1, ids)  # counts chunks: the fallback when no usage arrives
            elif ids:  # ids whose text is not out yet (a character split across tokens)
                record.answer(ids)
            if chunk.get("usage"):
                usage_tokens = chunk["usage"].get("completion_tokens")
            timing = chunk.get("servelab")  # ServeLab's own figures, on a choice's last chunk
            if isinstance(timing, dict) and isinstance(timing.get("ttft_s"), (int, float)):
                record.server_ttft_s = float(timing["ttft_s"])
        record.fail("the stream ended before data: [DONE]")


def _hang_up_on_stop(conn: http.client.HTTPConnection, stop: threading.Event, finished: threading.Event) -> None:
    stop.wait()  # the runner always sets stop when it returns, so this thread always ends
    if not finished.is_set() and conn.sock is not None:
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:  # the HTTP-date form: not worth parsing for a load test
        return None


def _send_one(target: Target, request: LoadRequest, record: RequestRecord, stop: threading.Event) -> None:
    try:
        target.send(request, record, stop)
    except Exception as exc:  # noqa: BLE001 - a target bug fails one request, not the run
        record.fail(f"{type(exc).__name__}: {exc}")


def run_load(
    target: Target,
    requests: list[LoadRequest],
    arrivals: list[float],
    max_duration_s: float = 300.0,
    clock: SleepingClock = WALL_CLOCK,
) -> list[RequestRecord]:
    """Fire each request at its offset on its own thread; return when all end or when
    max_duration_s has passed, recording any request still running (or never sent) as failed.
    The offsets are waited out on `clock` (a virtual one passes them at once); the last wait, a
    join on the request threads, is what is left of max_duration_s in wall seconds whatever the clock."""
    if len(arrivals) != len(requests):
        raise ValueError("one arrival time per request")
    records = [RequestRecord(i, r.request_id, len(r.prompt_token_ids), r.max_tokens) for i, r in enumerate(requests)]
    stop = threading.Event()
    start = clock.now()
    deadline = start + max_duration_s
    threads = []
    for request, record, offset in zip(requests, records, arrivals):
        wait = min(start + offset, deadline) - clock.now()
        if wait > 0:
            clock.sleep(wait)
        if clock.now() >= deadline:
            break
        thread = threading.Thread(target=_send_one, args=(target, request, record, stop), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, deadline - clock.now()))
    stop.set()  # unfinished targets give up (abort, hang up)
    for record in records:
        record.fail("not finished within max_duration_s")  # no-op on records that ended
    for thread in threads:
        thread.join(0.5)  # let the aborts go out; the threads are daemons if one hangs
    return records


# CLI --------------------------------------------------------------------------------------------


def _slo(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slo wants NAME=MS (ttft, tpot or e2el), got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.serving.load.loadgen", description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key")
    parser.add_argument("--rate", type=float, default=float("inf"), help="requests/s; 'inf' sends all at once")
    parser.add_argument("--burstiness", type=float, default=1.0, help="1 Poisson, <1 burstier, >1 more regular")
    parser.add_argument("--num-requests", type=int, default=50)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--range-ratio", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slo", type=_slo, action="append", default=[], help="NAME=MS, repeatable")
    parser.add_argument("--max-duration", type=float, default=300.0, help="seconds before giving up")
    parser.add_argument("--json", help="write the summary and every request's record here")
    args = parser.parse_args(argv)

    slos = dict(args.slo)
    if set(slos) - {"ttft", "tpot", "e2el"}:
        parser.error("--slo takes ttft, tpot or e2el (vLLM has no per-request ITL to judge)")
    target = HttpTarget(args.base_url, args.model, args.api_key)
    requests = make_requests(args.num_requests, args.prompt_tokens, args.output_tokens, args.range_ratio, args.seed)
    arrivals = arrival_times(args.rate, args.num_requests, args.burstiness, args.seed)
    print(f"{args.num_requests} requests at rate {args.rate} (burstiness {args.burstiness}) to {args.base_url}")
    started = now()
    records = run_load(target, requests, arrivals, args.max_duration)
    summary = summarize(records, now() - started, slos)
    print(format_table(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "args": vars(args) | {"rate": str(args.rate)},
                    "summary": summary,
                    "requests": [r.to_dict() for r in records],
                },
                f,
                indent=1,
            )
    return 0 if summary["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
