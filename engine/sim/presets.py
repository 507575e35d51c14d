"""The A/B presets (engine/sim/compare.py): three design choices of the System Design Lab, each
on traffic that shows the difference. Values are experiment keys (lever keys where a lever
exists); anything not named takes compare.py's defaults."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # Long prompts: one pool interleaves 8k-token prefills with decodes (TPOT stutters); two pools
    # keep decode steady and pay the KV hand-off and a smaller prefill pool in TTFT.
    "colocated_vs_disaggregated": {
        "title": "Colocated vs prefill/decode split",
        "traffic": {
            "request_rate": 6.0,
            "prompt_tokens": 8000,
            "output_tokens": 250,
            "num_requests": 240,
            "ttft_target_ms": 1000.0,
        },
        "a": {
            "label": "colocated",
            "model": "llama-3.1-70b",
            "device": "h200",
            "weight_dtype": "fp8",
            "gpu_count": 16,
            "tensor_parallel": 4,
        },
        "b": {
            "label": "disaggregated 12+4",
            "model": "llama-3.1-70b",
            "device": "h200",
            "weight_dtype": "fp8",
            "gpu_count": 16,
            "tensor_parallel": 4,
            "prefill_gpus": 12,
            "decode_gpus": 4,
        },
    },
    # 70B on one 8-GPU node: two TP4 replicas or one TP8 replica.
    "tp4_vs_tp8": {
        "title": "TP4 vs TP8 (70B on 8 H100s)",
        "traffic": {"request_rate": 20.0, "prompt_tokens": 1000, "output_tokens": 250, "num_requests": 600},
        "a": {"label": "2 x TP4", "model": "llama-3.1-70b", "device": "h100", "gpu_count": 8, "tensor_parallel": 4},
        "b": {"label": "1 x TP8", "model": "llama-3.1-70b", "device": "h100", "gpu_count": 8, "tensor_parallel": 8},
    },
    # 8B on one H100: continuous batching over paged KV, or static batches over contiguous slabs.
    "paged_vs_static": {
        "title": "Paged + continuous vs static batches (8B, one H100)",
        "traffic": {"request_rate": 12.0, "prompt_tokens": 1000, "output_tokens": 250, "num_requests": 500},
        "a": {"label": "paged, continuous", "model": "llama-3.1-8b", "device": "h100", "max_num_seqs": 64},
        "b": {"label": "static batches", "model": "llama-3.1-8b", "device": "h100", "max_num_seqs": 64, "paged": False},
    },
}
