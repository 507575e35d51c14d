"""What crosses the pipe between the front process and a replica: small picklable records.

Replica -> front: one StepMessage per engine step carries every new token of every request
on the replica, plus its typed stats (ReplicaStats: what the router needs, free slots and
blocks, and the facts the lab shows) and a heartbeat time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.engine_stats import EngineStats, field_values
from engine.core.kv_segment import SharedKV
from engine.core.sequence import FinishReason, RequestTimes
from engine.core.step_record import StepRecord
from engine.platform.machine import EnginePlan
from engine.sampling_params import SamplingParams


@dataclass
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # Stamped once, when the router admitted it (the replica never restamps); None only from a caller
    # with no queue in front (a test, a benchmark driving one replica): the hand-off is the arrival.
    arrival_time: float | None = None
    deadline: float | None = None  # the router's, in the same clock
    drop_if_expired: bool = True  # deadline_recheck as it stood when the router dispatched it
    priority: int = 0  # lower is admitted sooner by the scheduler
    # Prefill/decode disaggregation (engine/serving/disagg/): `handoff` on a prefill replica makes
    # the first token, then hands the prompt's KV off (TokenDelta.handoff) instead of decoding;
    # `kv` on a decode replica is that prompt's blocks, the prompt ending with the first token,
    # which was made at first_token_at.
    handoff: bool = False
    kv: SharedKV | None = None
    first_token_at: float | None = None


@dataclass
class AbortRequest:
    request_id: str


@dataclass
class Drain:
    """Admit nothing new; finish what is resident, then stop."""


@dataclass
class Reconfigure:
    """Levers the running engine takes in place (max_num_seqs, chunked_prefill, ...)."""

    changes: dict[str, Any]


@dataclass
class Stop:
    """Stop now; resident requests end with an error."""


@dataclass
class TokenDelta:
    request_id: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int
    # The request's timestamps, on the delta that carries its first token (TTFT and queue time are
    # counted then, not at the end of a long answer) and on its last delta (e2e, ITL).
    times: RequestTimes | None = None
    first_token: bool = False  # this delta carries the request's first output token
    logprobs: list[Any] | None = None  # TokenLogprobs of token_ids, when the request asked
    prompt_logprobs: list[Any] | None = None  # on the first token's delta, when asked (echo)
    # A prefill replica's last word on a handed-off request (not finished: it decodes elsewhere):
    # its prompt's KV blocks in shared memory, and the seconds taken to copy them out.
    handoff: SharedKV | None = None
    handoff_s: float = 0.0


@dataclass
class RequestError:
    request_id: str
    param: str | None
    message: str
    expired: bool = False  # dropped at its deadline (the request traces' "expired", not "failed")


def expired_error(request_id: str) -> RequestError:
    """A request dropped at its deadline: the router's queue and a replica answer it alike."""
    return RequestError(request_id, None, "deadline passed while queued", expired=True)


@dataclass
class Heartbeat:
    """Sent by a replica's heartbeat thread every heartbeat_s, even mid-step: silence means the
    process is frozen; a step_started long ago means its loop is stuck."""

    replica_id: int
    time: float
    step_started: float | None


@dataclass(frozen=True)
class ReplicaFailure:
    """Why a replica failed. permanent: a restart with the same configuration on this machine
    would fail the same way (a dtype the CPU cannot run, a missing model file, a kernel that does
    not load), so the fleet stops ordering replicas and says so instead of retrying forever."""

    reason: str
    permanent: bool

    @classmethod
    def of_load_error(cls, exc: BaseException) -> ReplicaFailure:
        """A load that raised: permanent unless a restart may heal it (memory others may free, a
        tensor-parallel group that did not form): else the same config on the same machine runs
        the same code and fails the same way."""
        from engine.parallel.distributed import ShardGroupError

        transient = isinstance(exc, (MemoryError, TimeoutError, ConnectionError, ShardGroupError))
        return cls(str(exc) or type(exc).__name__, permanent=not transient)


@dataclass
class ReplicaStats(EngineStats):
    """A replica's latest step, typed: its engine's stats (EngineStats, sharding included) and what
    its process adds. What its StepMessage carries over the pipe (a dataclass pickles as it is), and
    what the router, autoscaler, metrics bus and lab read by attribute. A live replica fills it from
    its engine's stats() in its own process (of_engine); a simulated one fills the counts it keeps,
    and the rest stay 0 or empty (no weights, no ranks)."""

    max_num_seqs: int = 0
    copy_gbs: float = 0.0  # the replica's measured memory copy bandwidth
    pid: int = 0  # rank 0's process (0: simulated)

    @classmethod
    def of_engine(cls, stats: EngineStats, *, max_num_seqs: int, pid: int, copy_gbs: float) -> ReplicaStats:
        """The engine's record widened by what the replica process knows."""
        return cls(**field_values(stats), max_num_seqs=max_num_seqs, pid=pid, copy_gbs=copy_gbs)


@dataclass
class StepMessage:
    replica_id: int
    time: float
    deltas: list[TokenDelta] = field(default_factory=list)
    errors: list[RequestError] = field(default_factory=list)
    stats: ReplicaStats | None = None  # None on the messages that carry no step (starting, failed)
    state: str = "ready"  # a ReplicaState (a StrEnum: messages stay plain strings once pickled)
    steps: list[StepRecord] = field(default_factory=list)  # the engine steps since the last message
    failure: ReplicaFailure | None = None  # with state "failed"
    plan: EnginePlan | None = None  # what the engine runs here, on the message that says it is ready
