"""The serving metrics a lesson names, each with exactly the span it measures (DESIGN.md's metric
contract, engine/serving/telemetry/metrics.py, `vllm bench serve`'s definitions).

A lesson defines a metric with `{{def:KEY}}` where the course first names it; every step page
also lists the metrics it uses, with these words, above its experiments. One table, so a page, a
lesson and the contract cannot say different things."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.serving.telemetry.metrics import WINDOW_S


@dataclass(frozen=True)
class Metric:
    key: str
    term: str  # as the text writes it
    meaning: str  # the span, in words (no ": ", so it sits in a plain YAML scalar)
    mentions: re.Pattern[str]  # how prose names it

    def inline(self, markdown: bool = True) -> str:
        term = f"**{self.term}**" if markdown else self.term
        return f"{term} ({self.meaning})"


def _names(*words: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w-])(?:" + "|".join(words) + r")(?![\w-])", re.IGNORECASE)


METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric("ttft", "TTFT", "time to first token, from the moment the router admits the request to its first "
               "output token; the wait in line and the prefill are both inside it", _names("ttft", "time to first token")),
        Metric("itl", "ITL", "inter-token latency, the gap between two consecutive deliveries of one stream (tokens "
               "made in one step arrive together and count once); every gap of every stream is one sample",
               _names("itl", "inter-token latency")),
        Metric("tpot", "TPOT", "time per output token, one request's (e2e latency - TTFT) / (output tokens - 1), "
               "the mean gap after its first token", _names("tpot", "time per output token")),
        Metric("e2el", "e2e latency", "end-to-end latency, from the router admitting the request to its last token",
               _names("e2e latency", "e2el", "end-to-end latency")),
        Metric("queue_time", "queue time", "from the router admitting the request to its first scheduled step, "
               "the central queue and any wait inside the replica together", _names("queue time", "queue_time")),
        Metric("goodput", "goodput", "the requests per second that finished within their latency targets (here "
               "TTFT within the TTFT target), not merely finished", _names("goodput")),
        Metric("kv_usage", "KV usage", "the share of the KV cache's blocks that hold some sequence's keys and values "
               "(vLLM's kv_cache_usage_perc)", _names("kv usage", "kv cache usage", "kv_cache_usage_perc")),
        # Only the full term: "hit rate" alone also names an answer cache's (lesson 1) and a random
        # prompt's zero (lesson 5), where no definition is owed.
        Metric("prefix_hit_rate", "prefix hit rate", f"the share of prompt tokens, over the last {WINDOW_S:g} s, "
               "found already in the KV cache when the request was admitted, counted in whole blocks (vLLM's "
               "prefix_cache_hits over prefix_cache_queries)", _names("prefix hit rate", "prefix-cache hit rate")),
        Metric("spec_acceptance", "acceptance rate", f"speculative decoding: the share of guesses, over the last "
               f"{WINDOW_S:g} s, that the model's own pass agreed with (vLLM's spec_decode_num_accepted_tokens over "
               "spec_decode_num_draft_tokens)", _names("acceptance rate")),
        Metric("spec_tokens_per_step", "tokens per step", "speculative decoding: the tokens a speculating decode "
               "made per step, the guesses kept plus the model's own (1 with no guess kept)",
               _names("tokens per verify step")),
    )
}  # fmt: skip


def used_in(text: str) -> list[Metric]:
    """The metrics a text names, in the table's order."""
    return [m for m in METRICS.values() if m.mentions.search(text)]
