"""The metrics bus: replica step messages in; Prometheus text and live snapshots out.

Names follow vLLM's where the concept is the same (DESIGN.md), so dashboards and autoscaling
rules written for vLLM work; ServeLab's own are `servelab_*`. Latencies are computed from the
engine's recorded timestamps, never estimated, and all start at the request's one arrival time
(stamped when the router admitted it), so they include the wait in the central queue:

  ttft        arrival -> first token            counted when the first token comes
  queue time  arrival -> first scheduled        (vLLM's meaning) = central queue + inside the replica
  e2e         arrival -> last token             counted when the request ends
  itl         one delivery of tokens -> the next (tokens landing in one step are one)"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Callable

from engine.clock import WALL_CLOCK, Clock
from engine.core.sequence import FinishReason, RequestTimes
from engine.serving.replicas.messages import ReplicaStats, StepMessage
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.snapshot import FleetSnapshot

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Per-replica running totals. num_expired: requests a replica dropped at their deadline (counted
# with the router's own as rejected "deadline"); expired_prefill_tokens: prompt tokens it
# prefilled for requests already past it (the deadline_recheck row of /failures).
# spec_*: speculative decoding's verify passes, guesses checked and guesses kept (vLLM's
# spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens).
COUNTERS = (
    "num_preemptions", "prefix_cache_queries", "prefix_cache_hits", "num_expired", "expired_prefill_tokens",
    "spec_checks", "spec_draft_tokens", "spec_accepted_tokens",
)  # fmt: skip
PREFIX_COUNTERS = ("prefix_cache_queries", "prefix_cache_hits")
SPEC_COUNTERS = ("spec_checks", "spec_draft_tokens", "spec_accepted_tokens")
WINDOW_S = 30.0  # sliding window for the live percentiles and rates
# The newest samples a window's percentiles are read from, at most: a snapshot sorts them, and a
# simulated 64-GPU fleet makes 25,000 token gaps a second (750,000 in a window: 0.2 s a sort).
# The live engine here stays well under it, so its windows are whole.
WINDOW_SAMPLES = 20_000


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, label: str) -> list[str]:
        out, cumulative = [f"# TYPE {name} histogram"], 0
        for bound, count in zip(self.buckets, self.counts):
            cumulative += count
            out.append(f'{name}_bucket{{{label},le="{bound}"}} {cumulative}')
        out.append(f'{name}_bucket{{{label},le="+Inf"}} {self.count}')
        return out + [f"{name}_sum{{{label}}} {self.total}", f"{name}_count{{{label}}} {self.count}"]


class CounterWindow:
    """Some running totals as they changed, so that what they grew by over the last WINDOW_S can
    be read (a windowed ratio of two counters: the prefix hit rate, speculation's acceptance)."""

    def __init__(self, now: float, width: int) -> None:
        self._points: deque[tuple[float, tuple[int, ...]]] = deque([(now, (0,) * width)])

    def note(self, now: float, totals: tuple[int, ...]) -> None:
        if totals != self._points[-1][1]:
            self._points.append((now, totals))

    def growth(self, now: float) -> tuple[int, ...]:
        """Each total's growth over the window: the newest against the last from before it began."""
        points = self._points
        while len(points) > 1 and now - points[1][0] > WINDOW_S:
            points.popleft()
        return tuple(b - a for a, b in zip(points[0][1], points[-1][1]))


class MetricsBus:
    def __init__(self, clock: Clock = WALL_CLOCK, events: EventLog | None = None) -> None:
        self.clock = clock
        self.events = events or EventLog(clock)
        self.histograms = {
            name: Histogram()
            for name in (
                "time_to_first_token_seconds",
                "inter_token_latency_seconds",
                "e2e_request_latency_seconds",
                "request_queue_time_seconds",
            )
        }
        # ServeLab's split of the queue time: the router's central queue, then the replica's scheduler.
        self.servelab_histograms = {
            name: Histogram() for name in ("central_queue_time_seconds", "replica_queue_time_seconds")
        }
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.wasted_tokens = 0  # generated for requests that were then cancelled, or whose client had gone
        # A prefill/decode split's handoffs: how many, the KV bytes moved, the seconds spent copying out.
        self.kv_handoffs = 0
        self.kv_handoff_bytes = 0
        self.kv_handoff_s = 0.0
        self._gone: set[str] = set()  # requests running on after their client hung up (client_gone)
        self._recent_wasted: deque[tuple[float, int]] = deque()
        self.text_sources: list[Callable[[], list[str]]] = []  # more Prometheus lines (the lab's clients)
        self.replica_stats: dict[int, ReplicaStats] = {}  # each replica's latest
        self._recent_ttft: deque[tuple[float, float]] = deque(maxlen=WINDOW_SAMPLES)
        self._recent_itl: deque[tuple[float, float]] = deque(maxlen=WINDOW_SAMPLES)
        self._recent_queue: deque[tuple[float, float]] = deque(maxlen=WINDOW_SAMPLES)
        self._recent_tpot: deque[tuple[float, float]] = deque(maxlen=WINDOW_SAMPLES)  # one per finished request
        self._recent_tokens: deque[tuple[float, int]] = deque()
        self._retired = dict.fromkeys(COUNTERS, 0)  # counters only grow: keep what retired replicas did
        self._prefix_totals = CounterWindow(clock.now(), len(PREFIX_COUNTERS))  # the windowed hit rate
        self._spec_totals = CounterWindow(clock.now(), len(SPEC_COUNTERS))  # speculation's, windowed
        self._lock = threading.Lock()

    def observe(self, msg: StepMessage) -> None:
        """Called for every message a replica sends (from its handle's reader thread)."""
        with self._lock:
            if msg.stats is not None:
                last = self.replica_stats.get(msg.replica_id)
                preempted = msg.stats.num_preemptions - (last.num_preemptions if last is not None else 0)
                if preempted > 0:
                    self.events.emit("preempted", f"replica {msg.replica_id} preempted {preempted} request(s)")
                self.replica_stats[msg.replica_id] = msg.stats
                self._note_totals(msg.time)
            produced = sum(len(d.token_ids) for d in msg.deltas)
            self.generation_tokens += produced
            if produced:
                self._recent_tokens.append((msg.time, produced))
            self._count_wasted(msg)
            for delta in msg.deltas:
                if delta.handoff is not None:
                    self.kv_handoffs += 1
                    self.kv_handoff_bytes += delta.handoff.nbytes
                    self.kv_handoff_s += delta.handoff_s
                if delta.first_token and delta.times:
                    self._first_token(delta.times, msg.time)
                if not delta.finished:
                    continue
                n = len(delta.times.tokens) if delta.times else 0
                if delta.request_id in self._gone:  # its tokens were counted as they came
                    self._gone.discard(delta.request_id)
                elif delta.finish_reason == FinishReason.ABORT:
                    self._waste(msg.time, n)
                if delta.finish_reason == FinishReason.ABORT:
                    self.events.emit("cancelled", f"{delta.request_id} cancelled", id=delta.request_id)
                else:
                    self.events.emit("finished", f"{delta.request_id} finished ({n} tokens)", id=delta.request_id)
                if delta.times:
                    self._finish(delta.num_prompt_tokens, delta.times, msg.time)

    # wasted work (issue 15: cancel_on_disconnect) ------------------------------------------------

    def client_gone(self, request_id: str) -> None:
        """The request's client hung up and the request runs on (cancel_on_disconnect off):
        every token it makes from now on is wasted."""
        with self._lock:
            self._gone.add(request_id)

    def gone_requests(self) -> list[str]:
        """Requests still running whose client has gone."""
        with self._lock:
            return list(self._gone)

    def forget_gone(self, request_id: str) -> None:
        """A gone request that will send no more (cancelled before it reached a replica)."""
        with self._lock:
            self._gone.discard(request_id)

    def _count_wasted(self, msg: StepMessage) -> None:
        for delta in msg.deltas:
            if delta.token_ids and delta.request_id in self._gone:
                self._waste(msg.time, len(delta.token_ids))

    def _waste(self, now: float, tokens: int) -> None:
        self.wasted_tokens += tokens
        if tokens:
            self._recent_wasted.append((now, tokens))

    def wasted_fields(self, now: float) -> dict[str, float]:
        """`wasted_tokens_per_s`: tokens made for clients already gone, over the window."""
        while self._recent_wasted and now - self._recent_wasted[0][0] > WINDOW_S:
            self._recent_wasted.popleft()
        return {"wasted_tokens_per_s": sum(n for _, n in self._recent_wasted) / WINDOW_S}

    def forget(self, replica_id: int) -> None:
        """A retired replica's last stats no longer count toward the fleet's running totals."""
        with self._lock:
            last = self.replica_stats.pop(replica_id, None)
            if last is None:
                return
            for key in COUNTERS:  # ReplicaStats fields
                self._retired[key] += getattr(last, key)

    def _note_totals(self, now: float) -> None:
        stats = list(self.replica_stats.values())
        self._prefix_totals.note(now, tuple(self._counter(stats, key) for key in PREFIX_COUNTERS))
        self._spec_totals.note(now, tuple(self._counter(stats, key) for key in SPEC_COUNTERS))

    def _prefix_hit_rate(self, now: float) -> float:
        """Hits / queries (prompt tokens) over the window; 0 when nothing was looked up."""
        queries, hits = self._prefix_totals.growth(now)
        return hits / queries if queries > 0 else 0.0

    def spec_fields(self, now: float) -> dict[str, float | None]:
        """Speculative decoding over the window: the share of guesses the model kept, and the
        tokens a speculating decode made per step (1 + kept guesses a check); None without checks."""
        checks, drafts, accepted = self._spec_totals.growth(now)
        return {
            "spec_acceptance": accepted / drafts if drafts else None,
            "spec_tokens_per_step": 1 + accepted / checks if checks else None,
        }

    def failure_metrics(self, now: float, ttft: list[float], stats: list[ReplicaStats]) -> dict[str, float]:
        """The /failures gallery's keys of the queue, router and scheduler rows (issue 15's part B);
        numbers in every snapshot: 0 while the window has nothing."""
        return {
            "expired_prefill_tokens": self._counter(stats, "expired_prefill_tokens"),
            "ttft_max": ttft[-1] if ttft else 0.0,
            "ttft_p999": window_percentile(ttft, 99.9) or 0.0,
            "prefix_hit_rate": self._prefix_hit_rate(now),
        }

    def _counter(self, stats: list[ReplicaStats], key: str) -> int:
        """One of COUNTERS (a ReplicaStats field) across the replicas, retired ones included."""
        return self._retired[key] + sum(getattr(s, key) for s in stats)

    def _first_token(self, times: RequestTimes, now: float) -> None:
        h = self.histograms
        if times.first_token is not None:
            ttft = times.first_token - times.arrival
            h["time_to_first_token_seconds"].observe(ttft)
            self._recent_ttft.append((now, ttft))
        if times.scheduled is not None:
            h["request_queue_time_seconds"].observe(times.scheduled - times.arrival)
            self._recent_queue.append((now, times.scheduled - times.arrival))
            if times.queued is not None:
                self.servelab_histograms["central_queue_time_seconds"].observe(times.queued - times.arrival)
                self.servelab_histograms["replica_queue_time_seconds"].observe(times.scheduled - times.queued)

    def _finish(self, prompt_tokens: int, times: RequestTimes, now: float) -> None:
        self.prompt_tokens += prompt_tokens
        h = self.histograms
        h["e2e_request_latency_seconds"].observe(now - times.arrival)
        tokens = times.tokens
        if len(tokens) > 1:  # tpot: the request's mean time per token after its first
            self._recent_tpot.append((now, (tokens[-1] - tokens[0]) / (len(tokens) - 1)))
        # One gap per delivery, as vLLM's server and `vllm bench serve` count them: tokens that land
        # together (a speculating step's kept guesses, a multi-step run) are one arrival.
        for a, b in zip(times.tokens, times.tokens[1:]):
            if b > a:
                h["inter_token_latency_seconds"].observe(b - a)
                self._recent_itl.append((now, b - a))

    def snapshot(
        self, queue_depth: int = 0, rejected: dict[str, int] | None = None, replicas: dict[str, int] | None = None
    ) -> FleetSnapshot:
        """The live stream's view: totals across replicas and percentiles over the window.
        replicas (by state) come from their owner, the fleet: a killed replica sends no message."""
        now = self.clock.now()
        with self._lock:
            for window in (self._recent_ttft, self._recent_itl, self._recent_queue, self._recent_tpot, self._recent_tokens):
                while window and now - window[0][0] > WINDOW_S:
                    window.popleft()
            stats = list(self.replica_stats.values())
            ttft = sorted(v for _, v in self._recent_ttft)
            itl = sorted(v for _, v in self._recent_itl)
            waits = sorted(v for _, v in self._recent_queue)
            tpot = sorted(v for _, v in self._recent_tpot)
            span = min(WINDOW_S, max(1e-3, now - self._recent_tokens[0][0])) if self._recent_tokens else 1.0
            rejected = dict(rejected or {})
            if expired := self._counter(stats, "num_expired"):  # dropped at a replica, not in the queue
                rejected["deadline"] = rejected.get("deadline", 0) + expired
            return FleetSnapshot(
                time=now,
                queue_depth=queue_depth,
                running=sum(s.running for s in stats),
                waiting=sum(s.waiting for s in stats),
                kv_used_blocks=sum(s.kv_used_blocks for s in stats),
                kv_total_blocks=sum(s.kv_total_blocks for s in stats),
                ttft_p50=window_percentile(ttft, 50),
                ttft_p99=window_percentile(ttft, 99),
                itl_p50=window_percentile(itl, 50),
                itl_p99=window_percentile(itl, 99),
                tpot_p50=window_percentile(tpot, 50),
                tpot_p99=window_percentile(tpot, 99),
                queue_time_p50=window_percentile(waits, 50),
                queue_time_p99=window_percentile(waits, 99),
                tokens_per_s=sum(n for _, n in self._recent_tokens) / span,
                replicas=dict(replicas or {}),
                rejected=rejected,
                preempted=self._counter(stats, "num_preemptions"),
                batch_size=sum(s.batch_size for s in stats),
                # Tensor parallelism: the slowest replica's time in all-reduces per step.
                allreduce_ms=max((s.allreduce_ms_per_step for s in stats), default=0.0),
                stage_idle=list(next((s.pp_stage_idle_share for s in stats if s.pp_stage_idle_share), [])),
                max_num_seqs=sum(s.max_num_seqs for s in stats),
                kv_handoffs=self.kv_handoffs,
                **self.wasted_fields(now),
                **self.failure_metrics(now, ttft, stats),
                **self.spec_fields(now),
            )

    def prometheus_text(
        self,
        model: str,
        queue_depth: int = 0,
        rejected: dict[str, int] | None = None,
        replicas: dict[str, int] | None = None,
    ) -> str:
        snap = self.snapshot(queue_depth, rejected, replicas)
        label = f'model_name="{model}"'
        total = snap.kv_total_blocks
        lines = [
            f"vllm:num_requests_running{{{label}}} {snap.running}",
            f"vllm:num_requests_waiting{{{label}}} {snap.waiting + queue_depth}",
            f"vllm:kv_cache_usage_perc{{{label}}} {snap.kv_used_blocks / total if total else 0.0}",
            f"vllm:prompt_tokens_total{{{label}}} {self.prompt_tokens}",
            f"vllm:generation_tokens_total{{{label}}} {self.generation_tokens}",
            f"vllm:num_preemptions_total{{{label}}} {snap.preempted}",
        ]
        with self._lock:
            stats = list(self.replica_stats.values())
            lines.append(f"vllm:prefix_cache_queries_total{{{label}}} {self._counter(stats, 'prefix_cache_queries')}")
            lines.append(f"vllm:prefix_cache_hits_total{{{label}}} {self._counter(stats, 'prefix_cache_hits')}")
            for name, key in zip(("num_drafts", "num_draft_tokens", "num_accepted_tokens"), SPEC_COUNTERS):
                lines.append(f"vllm:spec_decode_{name}_total{{{label}}} {self._counter(stats, key)}")
            for name, histogram in self.histograms.items():
                lines += histogram.lines(f"vllm:{name}", label)
            for name, histogram in self.servelab_histograms.items():
                lines += histogram.lines(f"servelab_{name}", label)
        for reason, count in sorted(snap.rejected.items()):
            lines.append(f'servelab_rejected_requests_total{{reason="{reason}"}} {count}')
        for state, count in sorted(snap.replicas.items()):
            lines.append(f'servelab_replicas{{state="{state}"}} {count}')
        lines.append(f"servelab_wasted_tokens_total {self.wasted_tokens}")
        lines.append(f"servelab_kv_handoffs_total {self.kv_handoffs}")
        lines.append(f"servelab_kv_handoff_bytes_total {self.kv_handoff_bytes}")
        lines.append(f"servelab_kv_handoff_export_seconds_total {self.kv_handoff_s}")
        lines.append(f"servelab_expired_prefill_tokens_total {snap.expired_prefill_tokens}")
        for source in list(self.text_sources):
            lines += source()
        return "\n".join(lines) + "\n"


def window_percentile(sorted_values: list[float], pct: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, round(pct / 100 * (len(sorted_values) - 1)))
    return sorted_values[index]
