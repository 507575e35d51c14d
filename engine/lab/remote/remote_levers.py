"""Which levers a remote lab applies itself and which belong to the remote server (issue 17).

The lab's own: its traffic, its clients and its proxy (REMOTE_LEVERS). The rest are the remote's
(paging, block size, batch slots, TP, ...): shown read-only, with the remote's value where
/v1/models or its metrics reveal it, and refused by name, saying where the remote sets it."""

from __future__ import annotations

from engine.lab.remote.remote_backend import RemoteInfo
from engine.lab.remote.remote_metrics import RemoteReading
from engine.levers import LEVERS, Apply

REMOTE_LEVERS = (
    "request_rate",
    "prompt_tokens",
    "output_tokens",
    "burstiness",
    "system_prompt_tokens",
    "system_prompt_share",
    "conversation_turns",
    "ttft_target_ms",
    "stream_flush",
    "retry_jitter",
    "cancel_on_disconnect",
    "client_patience_s",
    "client_retries",
    "proxy_idle_timeout_s",
)
# Where each of the rest is set on the remote (its server's flag), named in the refusal.
REMOTE_FLAGS = {
    "vLLM": {
        "model": "the model argument of `vllm serve`",
        "max_num_seqs": "--max-num-seqs",
        "max_batched_tokens": "--max-num-batched-tokens",
        "block_size": "--block-size",
        "tensor_parallel": "--tensor-parallel-size",
        "pipeline_parallel": "--pipeline-parallel-size",
        "gpu_count": "--tensor-parallel-size x --pipeline-parallel-size x --data-parallel-size",
        "prefix_caching": "--enable-prefix-caching / --no-enable-prefix-caching",
        "chunked_prefill": "--enable-chunked-prefill",
        "kv_budget_mb": "--gpu-memory-utilization",
        "kv_dtype": "--kv-cache-dtype",
        "num_speculative_tokens": "--speculative-config's num_speculative_tokens, with method ngram",
        "spec_lookup_max": "--speculative-config's prompt_lookup_max",
        "spec_lookup_min": "--speculative-config's prompt_lookup_min",
    },
    "SGLang": {
        "model": "--model-path",
        "max_num_seqs": "--max-running-requests",
        "max_batched_tokens": "--chunked-prefill-size",
        "block_size": "--page-size",
        "tensor_parallel": "--tp-size",
        "pipeline_parallel": "--pp-size",
        "gpu_count": "--tp-size x --pp-size x --dp-size",
        "prefix_caching": "--disable-radix-cache",
        "kv_budget_mb": "--mem-fraction-static",
        "kv_dtype": "--kv-cache-dtype",
        "num_speculative_tokens": "--speculative-algorithm with --speculative-num-draft-tokens",
    },
}


# Levers of the lab's own traffic that a remote lab cannot honour, and why.
NOT_REMOTE = {
    "prompt_style": "prompts in words are encoded with the served model's tokenizer, and a remote lab has none "
    "of its own: the remote lab's clients send random token ids",
}


def belongs_to_remote(key: str, flavour: str) -> str:
    """Why set_levers refuses `key`, and where the remote sets it."""
    if key in NOT_REMOTE:
        return NOT_REMOTE[key]
    flag = REMOTE_FLAGS.get(flavour or "", {}).get(key) or (
        "--" + key.replace("_", "-") + " of `python -m engine serve`" if flavour == "ServeLab" else None
    )
    where = f" (set it where the remote starts: {flag})" if flag else " (set it where the remote starts)"
    return f"{LEVERS[key].label} belongs to the remote server; the lab cannot change it from outside{where}"


def readonly_levers(info: RemoteInfo, reading: RemoteReading | None) -> dict[str, str]:
    """Each lever the remote owns, with its value where /v1/models or its metrics reveal it."""
    cache = reading.info if reading else {}
    known: dict[str, str] = {}
    if info.model:
        known["model"] = (
            info.model + (f" (max_model_len {info.max_model_len})" if info.max_model_len else "") + ", from /v1/models"
        )
    if cache.get("block_size"):
        known["block_size"] = f"{cache['block_size']} tokens, from vllm:cache_config_info"
    if cache.get("num_gpu_blocks"):
        known["kv_budget_mb"] = f"{int(float(cache['num_gpu_blocks'])):,} KV blocks in all, from vllm:cache_config_info"
    if cache.get("enable_prefix_caching"):
        known["prefix_caching"] = f"{cache['enable_prefix_caching'].lower()}, from vllm:cache_config_info"
    if cache.get("cache_dtype"):
        known["kv_dtype"] = f"{cache['cache_dtype']}, from vllm:cache_config_info"
    if reading is not None and reading.replicas:
        known["gpu_count"] = f"{sum(reading.replicas.values())} replica(s), from servelab_replicas"
    elif reading is not None and reading.engines:
        known["gpu_count"] = f"{reading.engines} engine(s) in its metrics"
    hidden = "set on the remote; its metrics do not reveal it"
    what_if = "the simulated fleet's only; the remote backend has no simulated mode"
    return {
        key: what_if if lever.apply == Apply.SIM else known.get(key, hidden)
        for key, lever in LEVERS.items()
        if key not in (*REMOTE_LEVERS, "executor")
    }
