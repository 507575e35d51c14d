"""The failure gallery (`/failures`): one row per production failure the guide names, each with
the step that teaches it, the defence lever whose "off" reproduces it, the live snapshot's key
that shows it, which way that metric moves when the defence is off, and what the incident looks
like in production.

The rows are the contract of issue 15's table: the page reads `metric` from every `/live`
snapshot (a key a snapshot lacks shows "no data"), and the lessons' "Break it" cards must use
their step's levers (web/lessons.py checks it). The words are ours."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Direction(enum.StrEnum):
    """Which way the metric moves when the defence is off."""

    UP = "up"
    DOWN = "down"


class Shape(enum.StrEnum):
    """How a sparkline reads the key: a level as it is, a running count as its rate per second,
    a list (one value per replica) as its largest member."""

    LEVEL = "level"
    RATE = "rate"
    MAX = "max"


@dataclass(frozen=True)
class Failure:
    step: int
    lever: str  # a defence lever (engine/levers.py, group "defence"): check_table() holds it to that
    title: str
    metric: str  # a top-level key of the /live metrics snapshot
    direction: Direction
    incident: str
    shape: Shape = Shape.LEVEL
    needs: str = ""  # what the failure needs to show on this machine, beyond the lever (off)


FAILURES: tuple[Failure, ...] = (
    Failure(1, "stream_flush", "A buffering proxy holds the stream", "client_ttft_p50", Direction.UP,
            "A proxy or load balancer buffers responses: users stare at a blank box, then the whole answer "
            "lands at once, while the server's own dashboards show a fast first token."),
    Failure(1, "heartbeat", "An idle proxy cuts waiting streams", "client_cut_before_first_token", Direction.UP,
            "Long queue waits send nothing, so an idle timeout between client and server closes the "
            "connection before the first token: the request was accepted and the user saw an error.",
            Shape.RATE, "a queue long enough to wait past proxy_idle_timeout_s"),
    Failure(1, "cancel_on_disconnect", "Nobody hears the client hang up", "wasted_tokens_per_s", Direction.UP,
            "Clients time out and retry, the abandoned requests keep generating: the fleet is busy, "
            "the GPUs are hot, and most of what they produce goes to nobody.",
            needs="client_patience_s shorter than the wait"),
    Failure(2, "queue_bound", "The queue becomes a delay line", "ttft_p99", Direction.UP,
            "With no cap, overload never says no: every request is accepted and waits longer than its "
            "user will, so the error rate stays at zero while goodput falls to nothing."),
    Failure(2, "deadline_recheck", "Prefill spent on the already expired", "expired_prefill_tokens", Direction.UP,
            "After a backlog, the fleet spends its recovery computing prompts for requests whose callers "
            "have already gone, and the backlog lasts longer than the spike that caused it.", Shape.RATE),
    Failure(2, "retry_jitter", "Retries in lockstep", "client_refused_total", Direction.UP,
            "Every refused client comes back after the same Retry-After, so refusals and arrivals pulse "
            "in synchronised waves: a thundering herd that the server keeps re-creating.", Shape.RATE,
            "client_retries above 0 and a full queue"),
    Failure(2, "central_queue", "One replica's queue while the other idles", "replica_queue_depths", Direction.UP,
            "Round-robin into per-replica queues: a request waits behind one long prefill while the next "
            "replica sits empty, and the tail latency belongs to bad luck.", Shape.MAX, "2 replicas"),
    Failure(3, "chunked_prefill", "A long prompt freezes every stream", "itl_p99", Direction.UP,
            "One user pastes a whole document and every other user's stream stalls mid-sentence until "
            "its prompt has been computed in one piece.", needs="a long prompt (step 3's button)"),
    Failure(4, "aging", "The unlucky request waits forever", "ttft_max", Direction.UP,
            "Under sustained load most requests are fine and the median looks healthy, but a few are "
            "passed over again and again: the complaints come from the tail, not the average.",
            needs="central_queue off, so requests wait in the replica's scheduler (a quarter of the lab's traffic "
            "is batch jobs at a lower priority)"),
    Failure(4, "batch_invariant", "The same prompt, a different answer", "tokens_per_s", Direction.UP,
            "Greedy decoding is not reproducible across load: the batch a request lands in changes the "
            "order of its sums, and so its logits; evaluations and cached answers disagree. Making it "
            "bitwise stable costs throughput (this lever is a cost, off by default).",
            needs="compare a prompt alone and inside a full batch"),
    Failure(5, "prefix_aware_routing", "The cache is on the other replica", "prefix_hit_rate", Direction.DOWN,
            "A conversation's history is cached where its last turn ran; spread without regard to that, later "
            "turns land on the other replica, which computes the history again: hit rate falls and time to first "
            "token rises. (One system prompt everyone shares is computed once per replica either way.)",
            needs="2 replicas and multi-turn conversations (conversation_turns)"),
    Failure(6, "collective_timeout", "A stopped rank hangs the group", "tokens_per_s", Direction.DOWN,
            "One GPU of a tensor-parallel group stops answering: the others wait inside an all-reduce "
            "forever, health checks pass, and the replica serves nothing until someone looks.",
            needs="tensor_parallel 2, requests running, and a rank stopped: Stop a rank (SIGSTOP) here, "
            "Resume it (SIGCONT)"),
    Failure(7, "drain_on_scale_in", "Scale-in cuts answers mid-sentence", "streams_cut_mid_stream", Direction.UP,
            "The autoscaler terminates a replica that is still streaming: users see answers stop in the "
            "middle, every scale-in is an outage for whoever was on that machine.", Shape.RATE,
            "2 replicas and a scale-in under load"),
    Failure(7, "asymmetric_windows", "The fleet flaps", "scale_changes_total", Direction.UP,
            "Scaling in as quickly as out, a load that hovers at the threshold adds and removes replicas "
            "over and over, paying cold starts each time and never settling.", Shape.RATE,
            "load that swings across the threshold (simulated mode shows it at scale)"),
    Failure(7, "count_pending", "Ordering machines that are already coming", "replicas_ordered_total", Direction.UP,
            "During a spike with slow provisioning, the autoscaler does not count machines still booting, "
            "so it orders again at every evaluation: the bill arrives for far more than the spike needed.",
            Shape.RATE, "a spike and a long provision_delay_s (simulated mode shows it at scale)"),
)


def failures_for_step(step: int) -> tuple[Failure, ...]:
    return tuple(f for f in FAILURES if f.step == step)


def check_table() -> list[str]:
    """What is wrong with the table itself (tests assert it is empty): every row a defence lever,
    each defence lever one row."""
    from engine.levers import DEFENCE_LEVERS

    problems = [f"{f.lever}: not a defence lever" for f in FAILURES if f.lever not in DEFENCE_LEVERS]
    levers = [f.lever for f in FAILURES]
    problems += [f"{key}: no row" for key in DEFENCE_LEVERS if key not in levers]
    problems += [f"{key}: more than one row" for key in set(levers) if levers.count(key) > 1]
    return problems
