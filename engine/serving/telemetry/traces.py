"""Request traces: one row per recent request, from its arrival to its end, for the swimlanes.

The router says when a request is admitted (with its `user`), refused, dispatched, expired in the
central queue or cancelled there; the replicas' StepMessages say the rest: each engine step's
StepRecord (prefill chunks, decode tokens, preemptions) and each request's end. Every time is the
fleet's clock (simulated seconds in simulated mode), the clock of the metrics snapshot's `time`;
nothing here reads wall time.

Bounded: the window holds the last WINDOW_ROWS requests, and older ones are counted in `summary`
by the outcome they had when they left. Sampled: new rows are admitted at most ROWS_PER_S a
second of the fleet's clock (a token bucket), the rest counted in `sampled`; a request whose
`user` is set always gets a row, and keeps it while it is in flight (a student finds their own)."""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from engine.clock import Clock
from engine.core.sequence import FinishReason
from engine.core.step_record import DECODE, HANDOFF, PREFILL, StepRecord
from engine.serving.replicas.messages import StepMessage

WINDOW_ROWS = 300
ROWS_PER_S = 30.0  # new rows a second at most, beyond those with a user: what a browser can draw
STEPS_KEPT = 60  # the batch chart's steps: the newest, across replicas
MAX_USER_LENGTH = 64
# A decoding row changes every step, but what a browser draws of it (a decode bar up to now) does
# not: it is sent again at most this often until its phase changes (a tick's bytes stay small).
REFRESH_S = 1.0


class Outcome(enum.StrEnum):
    QUEUED = "queued"  # in the router's central queue
    WAITING = "waiting"  # handed to a replica, not (or no longer, after a preemption) scheduled
    PREFILL = "prefill"
    HANDOFF = "handoff"  # a prefill/decode split: its KV on the way to a decode replica
    DECODE = "decode"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    REFUSED = "refused"
    EXPIRED = "expired"
    FAILED = "failed"


ENDED = frozenset({Outcome.FINISHED, Outcome.CANCELLED, Outcome.REFUSED, Outcome.EXPIRED, Outcome.FAILED})


@dataclass
class TraceRow:
    id: str
    user: str | None
    priority: int
    prompt_tokens: int
    max_tokens: int
    arrival: float
    outcome: Outcome = Outcome.QUEUED
    replica: int | None = None
    dispatched: float | None = None  # left the central queue
    scheduled: float | None = None  # first entered a batch
    chunks: list[list[float]] = field(default_factory=list)  # [step start, prompt tokens] per prefill chunk
    first_token: float | None = None
    preempted: list[float] = field(default_factory=list)
    last_token: float | None = None
    end: float | None = None
    output_tokens: int = 0
    tpot: float | None = None
    # A prefill/decode split: [sent by the prefill replica, first step on the decode one (None
    # while on the way), bytes of KV moved].
    handoff: list[float | None] | None = None
    _prefill_end: float | None = None  # the end of its latest prefill step: that step sampled a token
    _sent: float = float("-inf")  # when take_changes last sent it

    @property
    def ended(self) -> bool:
        return self.outcome in ENDED

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "user": self.user, "replica": self.replica, "priority": self.priority,
            "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens, "arrival": self.arrival,
            "dispatched": self.dispatched, "scheduled": self.scheduled, "chunks": [list(c) for c in self.chunks],
            "first_token": self.first_token, "preempted": list(self.preempted), "last_token": self.last_token,
            "end": self.end, "outcome": str(self.outcome), "output_tokens": self.output_tokens,
            "ttft": self.ttft, "tpot": self.tpot, "handoff": None if self.handoff is None else list(self.handoff),
        }  # fmt: skip

    def _decode(self, tokens: int, at: float) -> None:
        if self.first_token is None:
            self.first_token = self._prefill_end if self._prefill_end is not None else at
        self.outcome = Outcome.DECODE
        self.last_token = at
        self.output_tokens = max(self.output_tokens, 1) + tokens  # the prefill's last step sampled the first
        self._note_tpot()

    def _note_tpot(self) -> None:
        if self.first_token is not None and self.last_token is not None and self.output_tokens > 1:
            self.tpot = (self.last_token - self.first_token) / (self.output_tokens - 1)


class RequestTraces:
    def __init__(self, clock: Clock, window: int = WINDOW_ROWS, rows_per_s: float = ROWS_PER_S) -> None:
        self.clock = clock
        self.window = window
        self.rows_per_s = rows_per_s
        self._rows: OrderedDict[str, TraceRow] = OrderedDict()  # arrival order
        self._changed: dict[str, None] = {}  # ids changed since the last take_changes, in order
        self._steps: deque[StepRecord] = deque(maxlen=STEPS_KEPT)
        self._new_steps: deque[StepRecord] = deque(maxlen=STEPS_KEPT)
        self.summary: dict[str, int] = {}  # rows that left the window, by the outcome they had
        self.sampled = 0  # requests given no row (too many too fast), since the start
        self._tokens = rows_per_s  # the sampling bucket: one token per row, refilled on the clock
        self._refilled = clock.now()
        self._lock = threading.Lock()

    # the router ---------------------------------------------------------------------------------

    def admitted(
        self, request_id: str, user: str | None, priority: int, prompt_tokens: int, max_tokens: int, arrival: float
    ) -> None:
        with self._lock:
            self._new_row(TraceRow(request_id, user, priority, prompt_tokens, max_tokens, arrival))

    def refused(self, request_id: str, user: str | None, priority: int, prompt_tokens: int, max_tokens: int) -> None:
        now = self.clock.now()
        row = TraceRow(request_id, user, priority, prompt_tokens, max_tokens, now, Outcome.REFUSED, end=now)
        with self._lock:
            self._new_row(row)

    def dispatched(self, request_id: str, replica: int) -> None:
        with self._lock:
            if (row := self._rows.get(request_id)) is not None and not row.ended:
                row.replica, row.dispatched, row.outcome = replica, self.clock.now(), Outcome.WAITING
                self._changed[request_id] = None

    def ended(self, request_id: str, outcome: Outcome) -> None:
        """Ended outside a replica: expired or cancelled in the central queue, or stranded there."""
        with self._lock:
            self._end(request_id, outcome, self.clock.now())

    # the replicas -------------------------------------------------------------------------------

    def observe(self, msg: StepMessage) -> None:
        """A replica's message: its steps first (they ran before its deltas were sent), then ends."""
        with self._lock:
            for record in msg.steps:
                self._step(record)
            for delta in msg.deltas:
                row = self._rows.get(delta.request_id)
                if row is None or row.ended:
                    continue
                times = delta.times
                if times is not None or row.outcome is not Outcome.DECODE or msg.time - row._sent >= REFRESH_S:
                    self._changed[row.id] = None
                if delta.handoff is not None:  # its first token made here; it decodes on another replica
                    row.first_token = times.first_token if times is not None else msg.time
                    row.output_tokens, row.last_token = 1, row.first_token
                    row.handoff, row.outcome = [msg.time, None, float(delta.handoff.nbytes)], Outcome.HANDOFF
                    continue
                if times is not None:  # the engine's own stamps: on a first token and at the end
                    if row.scheduled is None:  # its first batch (a decode replica's comes later)
                        row.scheduled = times.scheduled
                    row.first_token = times.first_token if times.first_token is not None else row.first_token
                    if times.tokens:
                        row.last_token = times.tokens[-1]
                    row.output_tokens = max(row.output_tokens, len(times.tokens))
                    row.tpot = times.tpot if times.tpot is not None else row.tpot
                elif delta.token_ids:  # counted from the step records; its time is the message's
                    row.last_token = msg.time
                if delta.token_ids and not delta.finished:
                    row.outcome = Outcome.DECODE
                if delta.finished:
                    end = None if times is None else (times.aborted if delta.finish_reason == FinishReason.ABORT else times.finished)
                    outcome = Outcome.CANCELLED if delta.finish_reason == FinishReason.ABORT else Outcome.FINISHED
                    self._end(row.id, outcome, end if end is not None else msg.time)
            for error in msg.errors:
                self._end(error.request_id, Outcome.EXPIRED if error.expired else Outcome.FAILED, msg.time)

    def replica_ended(self, replica: int) -> None:
        """A replica stopped or failed: whatever was still on it will not finish."""
        now = self.clock.now()
        with self._lock:
            for row in [r for r in self._rows.values() if r.replica == replica and not r.ended]:
                self._end(row.id, Outcome.FAILED, now)

    # readers ------------------------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """Every row in the window, oldest arrival first."""
        with self._lock:
            return [row.to_dict() for row in self._rows.values()]

    def in_flight(self, user: str) -> list[str]:
        """Ids of `user`'s requests not yet ended (a departed student's, to cancel)."""
        with self._lock:
            return [row.id for row in self._rows.values() if row.user == user and not row.ended]

    def take_changes(self, whole: bool = False) -> dict[str, Any]:
        """What changed since the last call: the body of one `trace` tick (web/live.py).
        whole: every row and the recent steps instead (a stream switching to these traces)."""
        with self._lock:
            ids = self._rows if whole else self._changed
            sent = [self._rows[i] for i in ids if i in self._rows]
            now = self.clock.now()
            for row in sent:
                row._sent = now
            rows = [row.to_dict() for row in sent]
            steps = [s.to_dict() for s in (self._steps if whole else self._new_steps)]
            self._changed.clear()
            self._new_steps.clear()
            return {"rows": rows, "steps": steps, "summary": dict(self.summary), "sampled": self.sampled}

    def full(self) -> dict[str, Any]:
        """The whole window and the recent steps: for a browser that has just connected."""
        with self._lock:
            rows = [row.to_dict() for row in self._rows.values()]
            steps = [s.to_dict() for s in self._steps]
            return {"rows": rows, "steps": steps, "summary": dict(self.summary), "sampled": self.sampled}

    # inside -------------------------------------------------------------------------------------

    def _new_row(self, row: TraceRow) -> None:
        if row.user is None and not self._take_token():
            self.sampled += 1
            return
        self._rows[row.id] = row
        self._changed[row.id] = None
        while len(self._rows) > self.window:
            # The oldest row goes, unless it is someone's request still in flight: the next oldest.
            victim = next((r for r in self._rows.values() if r.user is None or r.ended), None)
            if victim is None:
                break
            del self._rows[victim.id]
            self._changed.pop(victim.id, None)
            self.summary[str(victim.outcome)] = self.summary.get(str(victim.outcome), 0) + 1

    def _take_token(self) -> bool:
        now = self.clock.now()
        self._tokens = min(self.rows_per_s, self._tokens + (now - self._refilled) * self.rows_per_s)
        self._refilled = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def _step(self, record: StepRecord) -> None:
        self._steps.append(record)
        self._new_steps.append(record)
        rows = self._rows
        for request_id in record.preempted:
            if (row := rows.get(request_id)) is not None and not row.ended:
                row.preempted.append(record.start)
                row.outcome = Outcome.WAITING
                self._changed[request_id] = None
        for entry in record.entries:
            row = rows.get(entry.request_id)
            if row is None or row.ended:
                continue
            if entry.phase != DECODE or row.outcome is not Outcome.DECODE or record.end - row._sent >= REFRESH_S:
                self._changed[row.id] = None
            if row.outcome is Outcome.HANDOFF and row.handoff is not None:  # landed: the decode replica's first step
                row.handoff[1] = record.start
            row.replica = record.replica
            if row.scheduled is None:
                row.scheduled = record.start
            if entry.phase == PREFILL:
                row.chunks.append([record.start, entry.tokens])
                row.outcome = Outcome.PREFILL
                row._prefill_end = record.end
            elif entry.phase == HANDOFF:  # landed: the last partial block computed, a token made
                row._decode(1, record.end)
            else:
                row._decode(entry.tokens, record.end)

    def _end(self, request_id: str, outcome: Outcome, at: float) -> None:
        row = self._rows.get(request_id)
        if row is None or row.ended:
            return
        row.outcome, row.end = outcome, at
        row._note_tpot()
        self._changed[request_id] = None
