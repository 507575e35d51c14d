"""The router: admission in one place, one central queue, and dispatch to replicas with room.

submit() checks everything cheap before any expensive work (key, rate limit, context length)
and either queues the request or refuses it. A dispatcher thread commits the queue's head to a
ready replica only when that replica has room (a free batch slot, KV blocks for the prompt and
nothing waiting inside it), preferring the replica that already caches the longest prefix of
the prompt, so no request waits in one replica's inbox while another sits idle.

Its defences (engine/serving/routing/defences.py, the fleet's object, read at each decision): with
central_queue off each request is handed at arrival to the next replica in turn, whatever it
holds (per-replica inboxes: a request can wait behind one replica's long prefill while another
idles); with prefix_aware_routing off the cached prefix is ignored and equal loads take turns."""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.clock import WALL_CLOCK, Clock
from engine.core.block_manager import blocks_for
from engine.errors import ServingError
from engine.sampling_params import SamplingParams
from engine.serving.driver import WallClockDriver
from engine.serving.replicas.messages import AddRequest, RequestError, expired_error
from engine.serving.replicas.replica_api import ENDED, Replica, ReplicaState
from engine.serving.routing.defences import Defences
from engine.serving.routing.prefix_memory import PrefixMemory, PromptBlocks
from engine.serving.routing.rate_limit import RateLimiter
from engine.serving.routing.request_queue import QueuedRequest, RequestQueue
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.traces import Outcome, RequestTraces

log = logging.getLogger("servelab.router")

PREFIX_MEMORY = 20_000  # block hashes remembered per replica for prefix-aware routing
ABORTED_KEPT = 4096  # request ids whose clients went away, remembered (Router.was_aborted)


class AdmissionError(ServingError):
    """A refusal before queueing; `reason` (the error code) is what the rejection counters count."""

    def __init__(
        self, status: int, reason: str, message: str, param: str | None = None, retry_after_s: int | None = None
    ):
        super().__init__(status, message, param, reason, retry_after_s)

    @property
    def reason(self) -> str:
        return self.code or ""


def api_keys_from_env() -> list[str]:
    """SERVELAB_API_KEYS=k1,k2: the bearer keys /v1/* asks for (empty: the API is open). Read here
    only; both servers' composition roots pass the list on."""
    return [key for key in os.environ.get("SERVELAB_API_KEYS", "").split(",") if key]


@dataclass
class RouterConfig:
    queue_cap: int = 64
    deadline_s: float | None = 30.0
    rate_limit: float | None = None  # requests/s per API key
    api_keys: list[str] = field(default_factory=list)  # empty: the API is open
    # Credentials the app issues itself (its pages' sessions: web/page_session.py), accepted beside
    # api_keys; the composition root sets it, the router only asks.
    issued: Callable[[str], bool] | None = None
    block_size: int = 16
    max_model_len: int = 8192  # the fleet sets it from the model's context window


class Router:
    def __init__(
        self,
        replicas: list[Replica],
        config: RouterConfig,
        clock: Clock = WALL_CLOCK,
        events: EventLog | None = None,
        dispatch_thread: bool = True,
        defences: Defences | None = None,
        traces: RequestTraces | None = None,
    ) -> None:
        """dispatch_thread=False: no thread; the caller's driver runs dispatch_step() (the fleet's,
        the what-if loop). True: a WallClockDriver of its own runs it (a router used alone).
        defences: the fleet's guards, shared with the queue; None: all on. traces: the fleet's
        request traces, told of every admission, refusal and dispatch; None: its own."""
        self.replicas = list(replicas)
        # A prefill/decode split's decode replicas: never dispatched to, but a client that goes
        # away is aborted there too, and remembered (the last ABORTED_KEPT) so no handoff follows.
        self.downstream: list[Replica] = []
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self.config = config
        self.clock = clock
        self.events = events or EventLog(clock)
        self.defences = Defences() if defences is None else defences
        self.traces = RequestTraces(clock) if traces is None else traces
        self.queue = RequestQueue(config.queue_cap, config.deadline_s, clock, defences=self.defences)
        self._turn = 0  # whose turn it is: round robin (central_queue off) and ties without prefix routing
        self.limiter = RateLimiter(config.rate_limit, clock)
        self.rejected: dict[str, int] = {}
        self.max_depth_seen = 0
        self._closed = False
        self._prefixes: dict[int, PrefixMemory] = {r.replica_id: PrefixMemory(PREFIX_MEMORY) for r in replicas}
        self._lock = threading.Lock()
        self.wake = threading.Event()  # set on submit: a driver watching it dispatches at once
        self._driver: WallClockDriver | None = None
        if dispatch_thread:
            self._driver = WallClockDriver("router-dispatch")
            self._driver.every(self.DISPATCH_POLL_S, self.dispatch_step, wake=self.wake)

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        api_key: str | None = None,
        events: queue.Queue | None = None,
        priority: int = 0,
        user: str | None = None,
    ) -> queue.Queue:
        """Admit or refuse (AdmissionError); an admitted request's events arrive on the returned
        queue (`events` if given: requests of one API call, n > 1 or a batch, share one):
        TokenDelta, or one RequestError (deadline, failed replica) that ends it. priority: the
        replica's scheduler admits lower first (aging raises a waiter's); the central queue is FIFO.
        user: the OpenAI `user` tag, carried to the request's trace row."""
        try:
            return self._admit(request_id, prompt_token_ids, params, api_key, events, priority, user)
        except AdmissionError:
            self.traces.refused(request_id, user, priority, len(prompt_token_ids), params.max_tokens)
            raise

    def _admit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        api_key: str | None,
        events: queue.Queue | None,
        priority: int,
        user: str | None,
    ) -> queue.Queue:
        self.authorize(api_key)
        wait = self.limiter.check(api_key or "")
        if wait > 0:
            raise self._refuse(429, "rate_limited", "rate limit exceeded", retry_after_s=self._rate_retry_after(wait))
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.config.max_model_len:
            raise self._refuse(
                400,
                "too_long",
                f"prompt + max_tokens is {total} tokens; the context holds {self.config.max_model_len}",
                param="max_tokens",
            )
        need = blocks_for(len(prompt_token_ids) + 1, self.config.block_size)
        largest = self._largest_cache()
        if largest is not None and need > largest:  # it would wait at the head of the line until its deadline
            raise self._refuse(
                400,
                "too_long",
                f"the prompt's {len(prompt_token_ids)} tokens need {need} KV blocks of {self.config.block_size} "
                f"tokens; the largest replica's cache holds {largest}",
                param="prompt",
            )
        events = queue.Queue() if events is None else events
        with self._lock:
            queued = QueuedRequest(request_id, prompt_token_ids, params, payload=events, priority=priority)
            admission = self.queue.offer(queued)
            self.max_depth_seen = max(self.max_depth_seen, len(self.queue))
            if admission.admitted:  # its row exists before the dispatcher can move it on
                self.traces.admitted(
                    request_id, user, priority, len(prompt_token_ids), params.max_tokens, queued.arrival
                )
        if not admission.admitted:
            raise self._refuse(429, "queue_full", "the request queue is full", retry_after_s=admission.retry_after_s)
        self.events.emit("admitted", f"{request_id} queued ({len(prompt_token_ids)} prompt tokens)", id=request_id)
        self.wake.set()
        return events

    def _rate_retry_after(self, wait: float) -> int:
        """Whole seconds until the key's bucket allows a request, plus up to as much again of
        jitter, so the refused do not come back in step; with retry_jitter off, the wait alone."""
        base = max(1, math.ceil(wait))
        return base + self.queue.rng.randint(0, base) if self.defences.retry_jitter else base

    def authorize(self, api_key: str | None) -> None:
        if not self.config.api_keys or api_key in self.config.api_keys:
            return
        if api_key is None or self.config.issued is None or not self.config.issued(api_key):
            raise self._refuse(401, "unauthorized", "missing or invalid API key")

    def abort(self, request_id: str) -> None:
        """The client went away: drop it from the queue, or abort it on its replica."""
        with self._lock:
            if self.queue.remove(request_id) is not None:
                self.traces.ended(request_id, Outcome.CANCELLED)
                return
        self._aborted[request_id] = None
        while len(self._aborted) > ABORTED_KEPT:
            self._aborted.popitem(last=False)
        for replica in self.replicas + self.downstream:
            replica.abort(request_id)

    def was_aborted(self, request_id: str) -> bool:
        """Its client went away lately (a prefill/decode split does not hand it on)."""
        return request_id in self._aborted

    def reconfigure(
        self, queue_cap: int | None = None, deadline_s: float | None = None, rate_limit: float | None = None
    ) -> None:
        """The queue and rate-limit levers, in place: requests already queued keep their place
        (a lower cap only refuses new arrivals) and their deadline."""
        with self._lock:
            if queue_cap is not None:
                self.config.queue_cap = self.queue.cap = queue_cap
            if deadline_s is not None:
                self.config.deadline_s = self.queue.deadline_s = deadline_s
            if rate_limit is not None:
                self.config.rate_limit = rate_limit or None
                self.limiter = RateLimiter(self.config.rate_limit, self.clock)

    def set_replicas(self, replicas: list[Replica]) -> None:
        """The replicas to dispatch to from now on (the fleet adds, retires or rebuilds them)."""
        with self._lock:
            self.replicas = list(replicas)
            for replica in replicas:
                if replica.replica_id not in self._prefixes:
                    self._prefixes[replica.replica_id] = PrefixMemory(PREFIX_MEMORY)
        self.wake.set()

    def close(self) -> None:
        self._closed = True
        self.wake.set()
        if self._driver is not None:
            self._driver.stop()

    # dispatch ---------------------------------------------------------------------------------

    DISPATCH_POLL_S = 0.01  # replicas free room without telling the router: it polls this often

    def dispatch_step(self) -> bool:
        """A driver's step: one dispatch pass; False once closed, so the driver lets it go."""
        if self._closed:
            return False
        self.dispatch_once()
        return True

    def dispatch_once(self) -> int:
        """One dispatch pass: answer expired and stranded requests, then commit the queue's head to
        replicas with room until one has none. Returns how many requests were dispatched."""
        dispatched = 0
        with self._lock:
            for expired in self.queue.take_expired():
                self._count("deadline", expired.request_id)
                self.traces.ended(expired.request_id, Outcome.EXPIRED)
                expired.payload.put(expired_error(expired.request_id))
            if self.replicas and all(r.state in ENDED for r in self.replicas):
                while (stranded := self.queue.pop()) is not None:  # nothing will ever serve them
                    self._count("no_replica", stranded.request_id)
                    self.traces.ended(stranded.request_id, Outcome.FAILED)
                    stranded.payload.put(RequestError(stranded.request_id, None, "no replica is available"))
            while (head := self.queue.peek()) is not None:
                replica = self._pick(head) if self.defences.central_queue else self._next_in_turn()
                if replica is None:
                    break
                self.queue.pop()
                self._remember_prefix(replica, head)
                request = AddRequest(
                    head.request_id, head.prompt_token_ids, head.params, head.arrival, head.deadline,
                    self.defences.deadline_recheck, head.priority,
                )
                replica.submit(request, events=head.payload)
                self.traces.dispatched(head.request_id, replica.replica_id)
                dispatched += 1
        return dispatched

    def _next_in_turn(self) -> Replica | None:
        """central_queue off: the next ready replica in turn, room or not (its inbox holds the rest)."""
        ready = [r for r in self.replicas if r.state == ReplicaState.READY]
        if not ready:
            return None
        self._turn += 1
        return ready[self._turn % len(ready)]

    def replica_queue_depths(self) -> list[int]:
        """Requests handed to each serving replica and not yet running there (its inbox and its
        scheduler's waiting line, central queue excluded): the central_queue row's metric."""
        with self._lock:
            replicas = list(self.replicas)
        return [max(0, r.num_in_flight - (r.stats.running if r.stats else 0)) for r in replicas]

    def _pick(self, request: QueuedRequest) -> Replica | None:
        prefix_aware = self.defences.prefix_aware_routing
        replicas = self.replicas
        # Prefix-blind, equal loads take turns (a plain least-loaded balancer), so a shared prompt
        # lands on every replica in turn; prefix-aware, ties go to the first, as they always have.
        if not prefix_aware and replicas:
            turn = self._turn % len(replicas)
            replicas = replicas[turn:] + replicas[:turn]
        # Room first: a full fleet (every poll of an over-capacity queue) answers before any hashing.
        # A replica with room: ready, a slot free, nobody waiting there, and the blocks of the
        # prompt and its first token free (inline: a big what-if queue asks it of 8 replicas a poll).
        need = blocks_for(len(request.prompt_token_ids) + 1, self.config.block_size)
        ready = ReplicaState.READY
        roomy = [
            r for r in replicas
            if r.state == ready and (s := r.stats) is not None
            and r.num_in_flight < s.max_num_seqs and s.waiting <= 0 and need <= s.free_blocks
        ]  # fmt: skip
        if not roomy:
            return None
        blocks = self._prompt_blocks(request) if prefix_aware else None
        best, best_key = None, None
        for replica in roomy:
            cached = 0 if blocks is None else self._prefixes[replica.replica_id].leading(blocks)
            key = (cached, -replica.num_in_flight)
            if best_key is None or key > best_key:
                best, best_key = replica, key
        if best is not None and not prefix_aware:
            self._turn += 1
        return best

    def _largest_cache(self) -> int | None:
        """KV blocks of the largest serving replica's whole cache; None before any has reported."""
        with self._lock:
            sizes = [r.stats.kv_total_blocks for r in self.replicas
                     if r.state == ReplicaState.READY and r.stats and r.stats.kv_total_blocks > 0]  # fmt: skip
        return max(sizes) if sizes else None

    def _prompt_blocks(self, request: QueuedRequest) -> PromptBlocks:
        """Made once per request (the head of the queue is looked at on every dispatch poll), its
        keys hashed as the prefix memories ask for them."""
        if request.blocks is None:
            request.blocks = PromptBlocks(request.prompt_token_ids, self.config.block_size)
        return request.blocks

    def _remember_prefix(self, replica: Replica, request: QueuedRequest) -> None:
        """The prompt's blocks become this replica's most recently sent, the oldest forgotten."""
        self._prefixes[replica.replica_id].remember(self._prompt_blocks(request))  # set_replicas made it

    def _refuse(self, status: int, reason: str, message: str, **kwargs: object) -> AdmissionError:
        self._count(reason)
        return AdmissionError(status, reason, message, **kwargs)  # type: ignore[arg-type]

    def _count(self, reason: str, request_id: str | None = None) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self.events.emit("rejected", f"{request_id or 'a request'} refused: {reason}", reason=reason)

