"""How a replica process takes a request into its engine, and reports its tokens: plainly; on a
prefill replica, to make its first token and hand the prompt's KV off (prefill/decode
disaggregation); or, on a decode replica, handed over with that KV, to decode from there.

The decode replica's prompt ends with the first token, made on the prefill replica at
first_token_at: its times start from that token (TTFT was counted where it was made; the gap to
the next token, the handoff included, is an inter-token gap), and it reports the prompt without
it. What differs from decoding where the prompt was prefilled: a seeded request's generator
starts afresh, and penalties do not count the first token."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from engine.core.kv_handoff import caches_of, import_prompt, read_shared, write_shared
from engine.core.request_output import RequestOutput
from engine.core.sequence import FinishReason, Sequence
from engine.serving.replicas.messages import AddRequest, TokenDelta


class ReplicaRequests:
    """The replica's side of its requests: which were handed over (their prompt counts one
    token less), and the deltas its outputs become."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.handed_over: set[str] = set()

    def add(self, cmd: AddRequest) -> Sequence:
        """The request into the engine (InvalidParamError for a bad one, FileNotFoundError for
        a handoff whose KV is gone)."""
        engine, params = self.engine, cmd.params
        if cmd.kv is not None:  # a decode replica's: import the prompt's blocks, then go on from the first token
            blocks = read_shared(cmd.kv)
            import_prompt(engine.kv, caches_of(engine.runner), cmd.prompt_token_ids[:-1], blocks)
            params = dataclasses.replace(params, max_tokens=params.max_tokens - 1, min_tokens=max(0, params.min_tokens - 1))
        elif cmd.handoff:  # a prefill replica's: the first token only, then the handoff
            params = dataclasses.replace(params, max_tokens=1, min_tokens=min(1, params.min_tokens))
        seq = engine.add_request(
            cmd.request_id, None, params, prompt_token_ids=cmd.prompt_token_ids, arrival_time=cmd.arrival_time,
            deadline=cmd.deadline, drop_if_expired=cmd.drop_if_expired, priority=cmd.priority,
        )  # fmt: skip
        if cmd.kv is not None:
            assert cmd.first_token_at is not None
            seq.times.first_token = cmd.first_token_at
            seq.times.tokens.append(cmd.first_token_at)
            seq.handed_over = True
            self.handed_over.add(cmd.request_id)
        seq.export_kv = cmd.handoff
        return seq

    def delta(self, out: RequestOutput) -> TokenDelta:
        seq = out.seq
        first = bool(out.new_token_ids) and len(seq.times.tokens) == len(out.new_token_ids)
        times = copy.deepcopy(seq.times) if first or out.finished else None
        handed = seq.request_id in self.handed_over
        seq.handed_over = False  # its first step here has been recorded
        if out.finished:
            self.handed_over.discard(seq.request_id)
        delta = TokenDelta(
            out.request_id, out.new_token_ids, out.new_text, out.finished, out.finish_reason,
            seq.num_prompt_tokens - handed, seq.num_cached_tokens, times, first, logprobs=out.logprobs,
            prompt_logprobs=seq.prompt_logprobs if first and seq.params.prompt_logprobs is not None else None,
        )  # fmt: skip
        if seq.exported_kv is not None and out.finish_reason == FinishReason.LENGTH:
            clock = self.engine.clock  # the engine's clock (wall time in a live replica)
            started = clock.now()
            shared = write_shared(seq.exported_kv)
            seq.exported_kv = None
            # Not finished: it decodes on; the front hands it to a decode replica.
            delta = dataclasses.replace(
                delta, finished=False, finish_reason=None, handoff=shared, handoff_s=clock.now() - started
            )
        return delta
