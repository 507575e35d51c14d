"""Live traffic for the lab: an open-ended load generator whose rate, lengths and burstiness
follow the levers while it runs, with an optional linear ramp (the "flood").

When each request arrives is the lab's one arrival loop's (engine/lab/arrivals.py: gamma gaps at
the rate of each moment, booked on a driver, here a WallClockDriver's timer; the simulated lab
books its arrivals with the same loop on its EventLoop); what arrives is next_request()'s, and
every request runs on its own thread.

Where the lab knows its server's URL (connect(): the composition root passes it once the server
is bound), each request goes over HTTP like any user's: the lab's clients (lab_clients.py:
patience, retries after a 429) stream /v1/completions through the lab's proxy (proxy.py:
stream_flush, proxy_idle_timeout_s), a real hop in front of the server, all read live from the
levers. Without a server (a LiveLab built in a unit test), RouterTarget sends in process, into
the same central queue. The driver times each request at its own end of the stream
(`clients`), the user's view beside the server's, and counts its attempts (`counts`)."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from typing import Any

from engine.clock import WALL_CLOCK, Clock
from engine.lab.arrivals import Arrivals, Ramp
from engine.lab.client_stats import ClientLatency
from engine.lab.live.lab_clients import (
    Attempt,
    AttemptOutcome,
    ClientCounts,
    ClientPolicy,
    LabHttpClient,
    RefusalHook,
)
from engine.lab.proxy import LabProxy, ProxySettings
from engine.serving.driver import Driver, WallClockDriver
from engine.serving.load.loadgen import VOCAB, LoadRequest, RouterTarget, Target, draw_length
from engine.serving.load.loadgen_metrics import RequestRecord, RequestStatus
from engine.serving.load.prompt_mix import Conversations, PromptMix, SystemPrompts, next_turn
from engine.serving.load.text_prompts import TextPrompts
from engine.serving.routing.router import Router

# The lab's traffic is a mix, as a real service's is: every BATCH_EVERY-th request is a batch
# job at a lower priority (vLLM's `priority`: higher is later). Aging keeps those from starving
# behind the interactive ones (the aging row of /failures, with central_queue off so that
# requests wait in a replica's own scheduler, where priorities order them).
BATCH_EVERY = 4
BATCH_PRIORITY = 1
MAX_IN_FLIGHT = 512  # client threads: past this the generator waits, so the web process stays light


# A request sent in process is one attempt: its status says how that attempt ended.
IN_PROCESS_OUTCOMES = {RequestStatus.OK: AttemptOutcome.OK, RequestStatus.REJECTED: AttemptOutcome.REFUSED}


class TrafficDriver:
    """`levers()` returns the lab's current levers: request_rate, prompt_tokens, output_tokens,
    burstiness, system_prompt_tokens, system_prompt_share, conversation_turns; over HTTP also
    stream_flush, proxy_idle_timeout_s, client_patience_s, client_retries and retry_jitter."""

    def __init__(
        self,
        router: Router | None,
        levers: Callable[[], dict[str, Any]],
        api_key: str | None = None,
        clock: Clock = WALL_CLOCK,
        seed: int = 0,
        driver: Driver | None = None,
        context: Callable[[], int | None] | None = None,
        texts: Callable[[], TextPrompts] | None = None,
    ) -> None:
        """context: the server's context window, where known (a conversation that would outgrow it
        starts anew); by default the router's. texts: makes the prompts in words (`prompt_style`
        quote and write) with the served model's tokenizer; None where there is none to use."""
        # No router: a remote backend's lab (issue 17), which connect()s before it sends.
        self._target: Target | None = None if router is None else RouterTarget(router, api_key)
        self._context = context or (lambda: None if router is None else router.config.max_model_len)
        self._api_key = api_key
        self.proxy: LabProxy | None = None
        self._levers = levers
        self.clock = clock
        self.rng = random.Random(seed)
        # Shared prefixes (the load levers system_prompt_tokens, system_prompt_share, conversation_turns).
        self.system_prompts = SystemPrompts(seed)
        self.conversations = Conversations()
        self.sent = 0  # requests (a retried one once); counts.sent counts attempts
        self.counts = ClientCounts()
        self.clients = ClientLatency()
        self._in_flight = threading.Semaphore(MAX_IN_FLIGHT)
        # The driver waits out the gaps. Never stopped: a stopped WallClockDriver stays stopped, and
        # the traffic starts again; a step booked for an earlier run finds the run moved on.
        self.arrivals = Arrivals(
            levers, clock, driver if driver is not None else WallClockDriver("traffic"), self._arrive, seed
        )
        self._run_id = uuid.uuid4().hex[:6]
        self._make_texts = texts
        self._texts: TextPrompts | None = None

    @property
    def refused(self) -> int:
        """429s the clients received (a retried request may add several)."""
        return self.counts.refused

    @property
    def target_url(self) -> str | None:
        """Where requests go: the proxy's URL (in front of the server), or None in process."""
        return None if self.proxy is None else self.proxy.base_url

    def connect(
        self,
        server_url: str,
        model: str,
        on_refusal: RefusalHook | None = None,
        settings: Callable[[], ProxySettings] | None = None,
    ) -> None:
        """From now on send over HTTP, through the lab's proxy, to the server at server_url
        (a base URL: the app's own server, or issue 17's remote one); on_refusal hears every
        answer other than 200 (lab_clients.RefusalHook); settings replaces the proxy's
        settings from the levers (a remote lab adds relay_hangup)."""
        self.close()
        self.proxy = LabProxy(server_url, settings or self.proxy_settings, clock=self.clock).start()
        self._target = LabHttpClient(
            self.proxy.base_url, model, self.client_policy, self.counts, self._api_key,
            random.Random(self.rng.random()), on_refusal,
        )

    def client_policy(self) -> ClientPolicy:
        """Read at each attempt: a lever moved mid-request applies from the next try."""
        return ClientPolicy.from_levers(self._levers())

    def proxy_settings(self) -> ProxySettings:
        levers = self._levers()
        return ProxySettings(bool(levers["stream_flush"]), float(levers["proxy_idle_timeout_s"]))

    def close(self) -> None:
        """Stop the proxy (requests still in it are cut); the driver sends in process after this."""
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None

    def fields(self) -> dict[str, int]:
        """The live snapshot's client counters."""
        return self.counts.fields()

    @property
    def running(self) -> bool:
        return self.arrivals.running

    @property
    def ramp(self) -> Ramp | None:
        return self.arrivals.ramp

    def current_rate(self) -> float:
        return self.arrivals.current_rate()

    def start(self, ramp_to: float | None = None, ramp_s: float = 30.0) -> None:
        """Start sending (or, if running, just set the ramp); ramp_to None holds the lever's rate."""
        self.arrivals.start(ramp_to, ramp_s)

    def levers_moved(self, changed: dict[str, Any]) -> None:
        """The load levers just moved: a flood's ramp ends when request_rate does (ramp_after)."""
        self.arrivals.levers_moved(changed)

    def stop(self) -> None:
        """Stop sending; requests in flight finish normally (none is cut)."""
        self.arrivals.stop()

    def next_request(self) -> LoadRequest:
        """The next arrival's request, its lengths drawn around the levers' means of this moment:
        a new prompt (after the shared system prompt, if it carries it), or a conversation's next
        turn (prompt_mix.py)."""
        levers = self._levers()
        out_mean = int(levers["output_tokens"])
        context = self._context()
        room = None if context is None else context - out_mean * 3 // 2  # the longest answer drawn
        turn = next_turn(PromptMix.from_levers(levers), self.rng, self.conversations, room)
        n_out = draw_length(self.rng, out_mean, 0.5)
        style = levers.get("prompt_style", "random")
        if style == "quote":
            own = self.text_prompts().quote(self.rng, turn.own_len)
        elif style == "write":
            own = self.text_prompts().write(self.rng, turn.own_len)
        else:
            own = [self.rng.randrange(*VOCAB) for _ in range(turn.own_len)]
        request = LoadRequest(
            f"flood-{self._run_id}-{self.sent}",
            list(turn.build(own, self.system_prompts.ids)),
            n_out,
            BATCH_PRIORITY if self.sent % BATCH_EVERY == BATCH_EVERY - 1 else 0,
            turn.conversation,
        )
        self.sent += 1
        return request

    def text_prompts(self) -> TextPrompts:
        """The prompts in words, encoded at the first ask; RuntimeError without a tokenizer."""
        if self._texts is None:
            if self._make_texts is None:
                raise RuntimeError("prompts in words need the served model's tokenizer, and this lab has none")
            self._texts = self._make_texts()
        return self._texts

    def _arrive(self) -> None:
        """One arrival, sent on a client thread. With MAX_IN_FLIGHT requests out it waits up to a
        second for one to end, then drops the arrival."""
        if self._in_flight.acquire(timeout=1.0):
            threading.Thread(target=self._send, args=(self.next_request(),), daemon=True).start()

    def burst(self, count: int) -> list[RequestRecord]:
        """Send `count` requests at once, beside any flood (a spike, an outage's backlog
        returning): their records, filled in as they run."""
        records = []
        for _ in range(count):
            if not self._in_flight.acquire(timeout=1.0):
                break
            request = self.next_request()
            record = RequestRecord(0, request.request_id, len(request.prompt_token_ids), request.max_tokens)
            records.append(record)
            threading.Thread(target=self._send, args=(request, record), daemon=True).start()
        return records

    def _send(self, request: LoadRequest, record: RequestRecord | None = None) -> None:
        record = record or RequestRecord(0, request.request_id, len(request.prompt_token_ids), request.max_tokens)
        self.clients.track(record)
        target = self._target
        if target is None:  # nothing to send to yet
            record.fail("the lab's traffic has no server to send to")
            self.counts.record(Attempt(self.clock.now(), 1, AttemptOutcome.FAILED, self.clock.now()))
            self._in_flight.release()
            return
        try:
            # Flood requests are never cut when the flood stops: the stop event stays clear.
            target.send(request, record, threading.Event())
            if not isinstance(target, LabHttpClient):  # in process: one attempt, counted here
                outcome = IN_PROCESS_OUTCOMES.get(RequestStatus(record.status), AttemptOutcome.FAILED)
                self.counts.record(Attempt(record.send_time or self.clock.now(), 1, outcome, self.clock.now()))
        finally:
            self._in_flight.release()
            # A turn answered goes on with exactly the ids generated; any other ending ends it.
            answer = record.output_token_ids if record.status == RequestStatus.OK else None
            self.conversations.ended(request.conversation, answer, int(self._levers().get("conversation_turns", 1)))
