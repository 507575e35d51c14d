"""The lab's clients over HTTP: they behave like users' clients, not like a benchmark.

Each request streams POST /v1/completions to a base URL (the lab's proxy in front of the app's
own server; issue 17 points the same clients at a remote one). What a client does, read from
the lab's levers at the moment it decides (ClientPolicy):

  patience_s  > 0: no first token within this many seconds of the FIRST attempt, and the client
              hangs up (`gave_up`), as a user closing the tab does; retry waits count too.
  retries     a 429 is retried after its Retry-After, up to this many times.
  retry_jitter on: a retry waits Retry-After plus a uniform [0, 1) s (the header carries whole
              seconds, so clients refused together would otherwise return on the same tick);
              off: exactly Retry-After (the server's defence of the same name drops its jitter).

Every timing starts at the first attempt's send (RequestRecord.start): a request refused twice
and then served has a TTFT that counts both waits, which is what its user saw. ClientCounts
keeps the running counts the live snapshot carries (sent and refused attempts, give-ups,
streams the proxy cut before their first token) and a log of recent attempts."""

from __future__ import annotations

import enum
import http.client
import json
import random
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from engine.lab.flood import FloodState
from engine.lab.proxy import IDLE_TIMEOUT_CODE
from engine.serving.load.loadgen import HttpTarget, LoadRequest, _retry_after, now
from engine.serving.load.loadgen_metrics import RequestRecord, RequestStatus

ATTEMPT_LOG = 20_000  # recent attempts kept (the arrivals chart and the tests read them)
STREAM_ENDED_EARLY = "the stream ended before data: [DONE]"  # HttpTarget._read_stream's words
# on_refusal(status, Retry-After header, body): a server's answer other than 200, or (status None)
# a connection that failed; the remote backend puts them in the event timeline (issue 17).
RefusalHook = Callable[[int | None, str | None, str], None]


class AttemptOutcome(enum.StrEnum):
    """How one send ended (a request's RequestStatus is how all its sends ended together)."""

    OK = "ok"
    REFUSED = "refused"  # a 429: retried while the policy allows, else the request ends rejected
    GAVE_UP = "gave_up"
    CUT = "cut"  # the proxy ended a stream before its first token
    FAILED = "failed"


class Hangup(enum.StrEnum):
    """Why _Hangup hung a connection up from outside."""

    STOPPED = "stopped"  # the run stopped
    GAVE_UP = "gave_up"  # the patience passed with no token yet


@dataclass(frozen=True)
class ClientPolicy:
    patience_s: float = 0.0  # 0: waits forever
    retries: int = 0
    retry_jitter: bool = True

    @classmethod
    def from_levers(cls, levers: dict[str, Any]) -> ClientPolicy:
        return cls(float(levers["client_patience_s"]), int(levers["client_retries"]), bool(levers["retry_jitter"]))


@dataclass(frozen=True)
class Attempt:
    """One send: when it went out (the clients' clock, seconds), which try it was (1 = first),
    and how it ended."""

    sent: float
    number: int
    outcome: AttemptOutcome
    ended: float


class ClientCounts:
    """Running counts since the lab started, shared by every client thread."""

    def __init__(self) -> None:
        self.sent = 0  # attempts, retries included
        self.refused = 0  # 429s received
        self.gave_up = 0
        self.cut_before_first_token = 0
        self.attempts: deque[Attempt] = deque(maxlen=ATTEMPT_LOG)
        self._lock = threading.Lock()

    def record(self, attempt: Attempt) -> None:
        with self._lock:
            self.sent += 1
            self.refused += attempt.outcome == AttemptOutcome.REFUSED
            self.gave_up += attempt.outcome == AttemptOutcome.GAVE_UP
            self.cut_before_first_token += attempt.outcome == AttemptOutcome.CUT
            self.attempts.append(attempt)

    def gave_up_waiting(self) -> None:
        """A client that left while waiting out a Retry-After (no attempt in flight)."""
        with self._lock:
            self.gave_up += 1

    def recent(self) -> list[Attempt]:
        with self._lock:
            return list(self.attempts)

    def fields(self) -> dict[str, int]:
        """The snapshot's client counters (DESIGN.md, issue 15's metric keys)."""
        return {
            "client_sent_total": self.sent,
            "client_refused_total": self.refused,
            "client_gave_up": self.gave_up,
            "client_cut_before_first_token": self.cut_before_first_token,
        }

    def prometheus_lines(self) -> list[str]:
        return [
            f"servelab_client_requests_sent_total {self.sent}",
            f"servelab_client_requests_refused_total {self.refused}",
            f"servelab_client_gave_up_total {self.gave_up}",
            f"servelab_client_cut_before_first_token_total {self.cut_before_first_token}",
        ]


def simulated_client_fields(traffic: FloodState) -> dict[str, int]:
    """The same counters for a simulated fleet (its flood state): its arrivals and refusals;
    its clients neither give up nor pass a proxy."""
    return {
        "client_sent_total": traffic.sent,
        "client_refused_total": traffic.refused,
        "client_gave_up": 0,
        "client_cut_before_first_token": 0,
    }


class LabHttpClient:
    """A Target (engine/serving/load/loadgen.py) whose requests behave as `policy()` says."""

    def __init__(
        self,
        base_url: str,
        model: str,
        policy: Callable[[], ClientPolicy],
        counts: ClientCounts,
        api_key: str | None = None,
        rng: random.Random | None = None,
        on_refusal: RefusalHook | None = None,
    ) -> None:
        self.http = HttpTarget(base_url, model, api_key)
        self.base_url = base_url
        self.policy = policy
        self.counts = counts
        self.rng = rng or random.Random()
        self.on_refusal = on_refusal  # told of every non-200 answer and failed connection, as it came
        self._rng_lock = threading.Lock()

    def send(self, request: LoadRequest, record: RequestRecord, stop: threading.Event) -> None:
        while True:
            policy = self.policy()  # read at each attempt: a lever moved mid-request applies to its next try
            outcome, retry_after = self._attempt(request, record, stop, policy)
            if outcome != AttemptOutcome.REFUSED or record.attempts > policy.retries:
                return
            wait = max(0.0, retry_after or 1.0)
            if policy.retry_jitter:
                with self._rng_lock:
                    wait += self.rng.random()
            patience = policy.patience_s
            waited = now() - (record.send_time or now())
            if patience > 0 and waited + wait >= patience:  # the user leaves before the retry would go
                if stop.wait(max(0.0, patience - waited)):
                    return
                record.give_up(f"no first token within {patience:g} s (waiting to retry)")
                self.counts.gave_up_waiting()
                return
            if stop.wait(wait):
                return
            if record.attempts > self.policy().retries:  # retries turned down while it waited
                record.reject(429, retry_after, "refused; no retry left")
                return

    def _attempt(
        self, request: LoadRequest, record: RequestRecord, stop: threading.Event, policy: ClientPolicy
    ) -> tuple[AttemptOutcome, float | None]:
        """One send; returns its outcome and, for a 429, the Retry-After. A final outcome is
        written into the record; a refusal that will be retried leaves it pending."""
        url = urlsplit(self.base_url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=self.http.timeout_s)
        sent = now()
        record.start(sent)
        hangup = _Hangup(conn, record, stop, policy.patience_s)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.http.api_key:
            headers["Authorization"] = f"Bearer {self.http.api_key}"
        outcome: AttemptOutcome = AttemptOutcome.FAILED
        retry_after: float | None = None
        try:
            conn.connect()
            hangup.sock = conn.sock  # the response takes the socket from conn: keep a hold on it
            if hangup.why:  # it ran out while connecting
                raise OSError("hung up")
            conn.request("POST", self.http.path, json.dumps(self.http.body(request)), headers)
            resp = conn.getresponse()
            if resp.status == 200:
                self.http._read_stream(resp, record)
            else:
                text = resp.read(2000).decode("utf-8", "replace")
                if self.on_refusal is not None:
                    self.on_refusal(resp.status, resp.getheader("Retry-After"), text)
                if resp.status == 429:
                    outcome, retry_after = AttemptOutcome.REFUSED, _retry_after(resp.getheader("Retry-After"))
                    if record.attempts > policy.retries:  # no retry left: the request ends refused
                        record.reject(429, retry_after, text)
                elif resp.status == 504 and IDLE_TIMEOUT_CODE in text:
                    record.fail(f"cut by the proxy: {text}", 504)
                else:
                    record.fail(f"HTTP {resp.status}: {text}", resp.status)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if not hangup.why:
                record.fail(f"{type(exc).__name__}: {exc}")
                if self.on_refusal is not None:
                    self.on_refusal(None, None, f"{type(exc).__name__}: {exc}")
        finally:
            hangup.done()
            conn.close()
        if hangup.why is Hangup.GAVE_UP:
            record.give_up(f"no first token within {hangup.patience_s:g} s")
            outcome = AttemptOutcome.GAVE_UP
        elif hangup.why is Hangup.STOPPED:
            record.fail("stopped")
        elif outcome != AttemptOutcome.REFUSED:
            outcome = _ending(record)
        self.counts.record(Attempt(sent, record.attempts, outcome, now()))
        return outcome, retry_after


def _ending(record: RequestRecord) -> AttemptOutcome:
    """ok; cut (the proxy ended a stream that had brought no token: its 504, or a stream that
    stopped short); or failed."""
    if record.status == RequestStatus.OK:
        return AttemptOutcome.OK
    if record.token_times:
        return AttemptOutcome.FAILED
    error = record.error or ""
    early = error.startswith((STREAM_ENDED_EARLY, "cut by the proxy", "IncompleteRead", "RemoteDisconnected"))
    return AttemptOutcome.CUT if record.http_status == 504 or early else AttemptOutcome.FAILED


class _Hangup:
    """Hangs the connection up from outside (a blocked read cannot see a clock): when the run
    stops, or when the patience passes with no token yet. `why` says which, if either did."""

    def __init__(self, conn: http.client.HTTPConnection, record: RequestRecord, stop: threading.Event, patience_s: float):
        self.conn, self.record, self.stop, self.patience_s = conn, record, stop, patience_s
        self.sock: socket.socket | None = None  # set once connected
        self.why: Hangup | None = None
        self._finished = threading.Event()
        threading.Thread(target=self._watch, name="client-hangup", daemon=True).start()

    def done(self) -> None:
        self._finished.set()

    def _watch(self) -> None:
        start = self.record.send_time or now()
        while not self._finished.is_set():
            if self.stop.is_set():
                self._hang_up(Hangup.STOPPED)
                return
            waiting = self.patience_s > 0 and not self.record.token_times
            left = start + self.patience_s - now()
            if waiting and left <= 0:
                self._hang_up(Hangup.GAVE_UP)
                return
            self._finished.wait(min(left, 0.5) if waiting else 0.5)  # wakes at the patience's end

    def _hang_up(self, why: Hangup) -> None:
        self.why = why
        sock = self.sock or self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
