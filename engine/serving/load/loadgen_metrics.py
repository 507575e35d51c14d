"""What the load generator records per request, and the summary `vllm bench serve` prints.

Definitions follow vLLM's benchmark (vllm/benchmarks/serve.py, calculate_metrics):
TTFT = first token chunk - send; E2EL = last token chunk - send (vLLM's `latency`);
TPOT = (E2EL - TTFT) / (output_tokens - 1) for requests with more than one token;
ITL = every gap between successive token chunks, pooled over all requests;
goodput = completed requests meeting every SLO, per second of the run."""

from __future__ import annotations

import enum
import math
import threading
from dataclasses import dataclass, field
from typing import Any

SLO_METRICS = ("ttft", "tpot", "e2el")  # per-request metrics an SLO can bound, as in vLLM
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


class RequestStatus(enum.StrEnum):
    """How a request ended (pending until it does). A StrEnum: to_dict's JSON and the result files
    keep the plain words, and a member still equals its string."""

    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"
    REJECTED = "rejected"  # refused at admission (its http_status says why), so it never ran
    GAVE_UP = "gave_up"  # the client's patience ran out


NOT_FAILURES = (RequestStatus.OK, RequestStatus.REJECTED)  # the summary counts every other status as failed


@dataclass
class RequestRecord:
    """One request's outcome. Targets write it from their own thread; the runner may give up
    on it (abandon) concurrently, so every write goes through the lock and a closed record
    ignores late writes."""

    index: int
    request_id: str
    prompt_tokens: int
    max_tokens: int
    status: RequestStatus = RequestStatus.PENDING
    send_time: float | None = None  # loadgen.now() seconds, of the first attempt (what a user waits from)
    token_times: list[float] = field(default_factory=list)  # every chunk that carried tokens
    end_time: float | None = None
    output_tokens: int = 0
    error: str | None = None
    http_status: int | None = None
    retry_after_s: float | None = None
    attempts: int = 0  # sends of this request: 1, plus one per retry after a 429
    server_ttft_s: float | None = None  # what the server measured (ServeLab's `servelab` extension), if it said
    # The generated ids, where the target sees them (in process, or a server asked for return_token_ids):
    # a conversation's next turn resends them exactly (engine/serving/load/prompt_mix.py).
    output_token_ids: list[int] = field(default_factory=list)
    _counted: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    # writes (targets and runner) --------------------------------------------------------------

    def start(self, now: float) -> None:
        """An attempt goes out; the first one's time is the request's send time, so a retried
        request's TTFT and e2e count every wait its user sat through."""
        with self._lock:
            if self.status == RequestStatus.PENDING:
                self.attempts += 1
                if self.send_time is None:
                    self.send_time = now

    def token(self, now: float, count: int = 1, ids: list[int] | None = None) -> None:
        with self._lock:
            if self.status == RequestStatus.PENDING:
                self.token_times.append(now)
                self._counted += count
                if ids:
                    self.output_token_ids += ids

    def answer(self, ids: list[int]) -> None:
        """Generated ids that came without a token time of their own."""
        with self._lock:
            if self.status == RequestStatus.PENDING:
                self.output_token_ids += ids

    def done(self, output_tokens: int | None = None) -> None:
        """The stream ended normally; output_tokens from usage when the server gave it."""
        with self._lock:
            if self.status != RequestStatus.PENDING:
                return
            if not self.token_times:
                self.status, self.error = RequestStatus.FAILED, "the stream ended without a token"
                return
            self.status = RequestStatus.OK
            self.end_time = self.token_times[-1]  # vLLM's latency: the last token chunk
            self.output_tokens = output_tokens if output_tokens else self._counted

    def fail(self, message: str, http_status: int | None = None) -> None:
        with self._lock:
            if self.status == RequestStatus.PENDING:
                self.status, self.error, self.http_status = RequestStatus.FAILED, message, http_status

    def give_up(self, message: str) -> None:
        """The client stopped waiting and hung up (its patience ran out)."""
        with self._lock:
            if self.status == RequestStatus.PENDING:
                self.status, self.error = RequestStatus.GAVE_UP, message

    def reject(self, http_status: int, retry_after_s: float | None, message: str) -> None:
        with self._lock:
            if self.status == RequestStatus.PENDING:
                self.status, self.http_status = RequestStatus.REJECTED, http_status
                self.retry_after_s, self.error = retry_after_s, message

    # derived values (seconds) -----------------------------------------------------------------

    @property
    def ttft(self) -> float | None:
        if self.send_time is None or not self.token_times:
            return None
        return self.token_times[0] - self.send_time

    @property
    def e2el(self) -> float | None:
        if self.send_time is None or self.end_time is None:
            return None
        return self.end_time - self.send_time

    @property
    def tpot(self) -> float:
        """0 for a one-token request, as vLLM counts it for goodput."""
        ttft, e2el = self.ttft, self.e2el
        if ttft is None or e2el is None or self.output_tokens <= 1:
            return 0.0
        return (e2el - ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    def to_dict(self) -> dict[str, Any]:
        ok = self.status == RequestStatus.OK
        return {
            "index": self.index,
            "request_id": self.request_id,
            "status": self.status,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "output_tokens": self.output_tokens,
            "ttft_ms": _ms(self.ttft) if ok else None,
            "tpot_ms": _ms(self.tpot) if ok else None,
            "e2el_ms": _ms(self.e2el) if ok else None,
            "itl_ms": [_ms(x) for x in self.itls] if ok else [],
            "error": self.error,
            "http_status": self.http_status,
            "retry_after_s": self.retry_after_s,
            "attempts": self.attempts,
            "server_ttft_ms": _ms(self.server_ttft_s) if self.server_ttft_s is not None else None,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def percentile(values: list[float], p: float) -> float:
    """numpy.percentile's default (linear interpolation); 0 for no values, as vLLM reports."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(records: list[RequestRecord], duration_s: float, slos: dict[str, float] | None = None) -> dict[str, Any]:
    """The run's numbers, keyed like vLLM's JSON result (mean_ttft_ms, p99_itl_ms, ...)."""
    slos = dict(slos or {})
    unknown = set(slos) - set(SLO_METRICS)
    if unknown:  # vLLM has no per-request ITL, so an ITL SLO cannot decide one request
        raise ValueError(f"SLOs can bound {', '.join(SLO_METRICS)}; got {', '.join(sorted(unknown))}")
    if duration_s <= 0:
        raise ValueError("duration_s must be positive")
    done = [r for r in records if r.status == RequestStatus.OK]
    values: dict[str, list[float]] = {
        "ttft": [r.ttft for r in done],  # type: ignore[misc]  (set for every ok record)
        "tpot": [r.tpot for r in done if r.output_tokens > 1],
        "itl": [gap for r in done for gap in r.itls],
        "e2el": [r.e2el for r in done],  # type: ignore[misc]
    }
    good = sum(all(getattr(r, name) * 1000.0 <= slo for name, slo in slos.items()) for r in done)
    total_in = sum(r.prompt_tokens for r in done)
    total_out = sum(r.output_tokens for r in done)
    rejected = [r for r in records if r.status == RequestStatus.REJECTED]
    summary: dict[str, Any] = {
        "duration_s": duration_s,
        "num_requests": len(records),
        "completed": len(done),
        "failed": sum(r.status not in NOT_FAILURES for r in records),
        "rejected": len(rejected),
        "rejected_by_status": _count(str(r.http_status) for r in rejected),
        "errors": _count(r.error or "" for r in records if r.status not in NOT_FAILURES),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
        "slos_ms": slos,
        "request_goodput": good / duration_s if slos else None,
    }
    for name in LATENCY_METRICS:
        seconds = values[name]
        summary[f"mean_{name}_ms"] = (sum(seconds) / len(seconds) if seconds else 0.0) * 1000.0
        summary[f"median_{name}_ms"] = percentile(seconds, 50) * 1000.0
        summary[f"p99_{name}_ms"] = percentile(seconds, 99) * 1000.0
    return summary


def _count(keys: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return counts


TITLES = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}


def format_table(summary: dict[str, Any]) -> str:
    """The result block in vllm bench serve's layout, so numbers read side by side."""
    rows: list[str] = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="=")]

    def row(label: str, value: Any) -> None:
        rows.append(f"{label:<40} {value:<10.2f}" if isinstance(value, float) else f"{label:<40} {value:<10}")

    row("Successful requests:", summary["completed"])
    row("Failed requests:", summary["failed"])
    row("Rejected requests:", summary["rejected"])
    row("Benchmark duration (s):", summary["duration_s"])
    row("Total input tokens:", summary["total_input_tokens"])
    row("Total generated tokens:", summary["total_output_tokens"])
    row("Request throughput (req/s):", summary["request_throughput"])
    if summary["request_goodput"] is not None:
        row("Request goodput (req/s):", summary["request_goodput"])
    row("Output token throughput (tok/s):", summary["output_throughput"])
    row("Total Token throughput (tok/s):", summary["total_token_throughput"])
    for name, title in TITLES.items():
        rows.append("{s:{c}^50}".format(s=title, c="-"))
        upper = name.upper()
        row(f"Mean {upper} (ms):", summary[f"mean_{name}_ms"])
        row(f"Median {upper} (ms):", summary[f"median_{name}_ms"])
        row(f"P99 {upper} (ms):", summary[f"p99_{name}_ms"])
    rows.append("=" * 50)
    for reason, n in summary["errors"].items():
        rows.append(f"failed x{n}: {reason}")
    return "\n".join(rows)
