"""The live charts a lesson may name, with the title a page gives each (the validator, the
authors' reference and the pages read this one table)."""

from __future__ import annotations

CHARTS = {  # the live charts a lesson may name, with the title a page gives each
    "queue_depth": "Queue depth",
    "running": "Running and waiting requests",
    "kv_blocks": "KV blocks used / total",
    "ttft": "TTFT p50 / p99 (s): server and clients",
    "itl": "ITL p50 / p99 (s)",
    "tpot": "TPOT p50 / p99 (s): each finished request's time per token after its first",
    "tokens_per_s": "Output tokens/s",
    "rejected": "Refused requests (total)",
    "preempted": "Preemptions (total)",
    "replicas": "Replicas by state",
    "batch_size": "Batch size / slots",
    "allreduce_ms": "Tensor parallel: all-reduce time per step (ms)",
    "prefix_hit_rate": "Prefix-cache hit rate (% of prompt tokens)",
    "speculation": "Speculative decoding: guesses kept (%) and tokens per step",
    "stage_idle": "Pipeline stages: each stage's idle share, the bubble (%)",
    "scaling": "Autoscaler: scale changes, replicas ordered, streams cut (totals)",
    # Drawn by static/traces.js from the `trace` event, not from the metrics snapshot.
    "swimlanes": "Requests, one row each: queued, waiting, prefill chunks, decode, preempted, end",
    "batch_steps": "The batch, step by step: each engine step's tokens against the budget, and its time (model + host)",
    "stage_steps": "Pipeline stages, batch by batch: where each stage worked, and where it idled (the bubble)",
}
TRACE_CHARTS = frozenset({"swimlanes", "batch_steps", "stage_steps"})  # the charts above that are not Plotly series
# The charts only an engine of ours feeds: the traces, the pipeline stages' busy time, and (not yet
# read from a remote's metrics: engine/lab/remote/remote_metrics.py) TPOT and speculation's counts.
OWN_ENGINE_CHARTS = TRACE_CHARTS | {"stage_idle", "tpot", "speculation"}
