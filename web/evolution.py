"""The five evolution scenario cards, in the System Design Lab's order: each sets levers on the
live engine and says what to watch. `sim_levers` is the same step at scale, what a card sets
when the lab runs the simulated executor (every simulated lever it depends on is named, so a
card gives the same experiment whatever was set before), and `sim_watch` what to watch there."""

from __future__ import annotations

# What every at-scale card starts from: one H100, colocated, bf16, the autoscaler held at one.
AT_SCALE = {
    "device": "h100", "weight_dtype": "bf16", "kv_dtype": "bf16", "prefill_gpus": 0, "decode_gpus": 0,
    "min_replicas": 1, "max_replicas": 1, "warm_pool": 0, "chunked_prefill": True, "max_batched_tokens": 8192,
}

EVOLUTION = (
    {
        "title": "One device, one request at a time",
        "sim_watch": "One H100 serving Llama-3.1-8B one request at a time: 2 req/s of 200-token answers already queue, and tokens/s is a single stream's.",
        "levers": {"paged": False, "max_num_seqs": 1, "request_rate": 1.0, "prompt_tokens": 200, "output_tokens": 64},
        "sim_levers": AT_SCALE | {
            "model": "llama-3.1-8b", "gpu_count": 1, "tensor_parallel": 1, "paged": False, "max_num_seqs": 1,
            "request_rate": 2.0, "prompt_tokens": 1000, "output_tokens": 200,
        },
        "watch": "Static batches of one: running never exceeds 1, the queue grows whenever two requests overlap, "
        "and tokens/s is one sequence's decode speed. The weights are read once per token for a single user.",
    },
    {
        "title": "KV cache with static batching",
        "sim_watch": "64 static slots at 20 req/s: tokens/s climbs, but each batch waits for its longest member and the KV chart shows the max-length slabs.",
        "levers": {"paged": False, "max_num_seqs": 16, "request_rate": 2.0},
        "sim_levers": AT_SCALE | {
            "model": "llama-3.1-8b", "gpu_count": 1, "tensor_parallel": 1, "paged": False, "max_num_seqs": 64,
            "request_rate": 20.0, "prompt_tokens": 1000, "output_tokens": 200,
        },
        "watch": "Sixteen requests share each weight read, so tokens/s climbs. But a batch only ends when its "
        "longest member does: batch_size sags as short requests finish and new ones wait for the whole batch. "
        "Each slot reserves KV for prompt plus max output up front.",
    },
    {
        "title": "Continuous batching + paged attention",
        "sim_watch": "The same 20 req/s with continuous batching and paged KV: the queue drains, batch size follows demand, KV holds only real tokens.",
        "levers": {"paged": True, "max_num_seqs": 64, "request_rate": 2.0},
        "sim_levers": AT_SCALE | {
            "model": "llama-3.1-8b", "gpu_count": 1, "tensor_parallel": 1, "paged": True, "max_num_seqs": 256,
            "request_rate": 20.0, "prompt_tokens": 1000, "output_tokens": 200,
        },
        "watch": "Requests join and leave the batch every step, so batch_size tracks demand and the queue drains "
        "as soon as anything finishes. KV blocks are taken as tokens arrive: kv_blocks holds only real tokens.",
    },
    {
        "title": "Tensor-parallel sharding",
        "sim_watch": "Llama-3.1-70B does not fit one H100: TP8 holds 17.6 GB of weights per GPU and pays two all-reduces a layer every step.",
        "levers": {"gpu_count": 2, "tensor_parallel": 2, "paged": True},
        "sim_levers": AT_SCALE | {
            "model": "llama-3.1-70b", "gpu_count": 8, "tensor_parallel": 8, "paged": True, "max_num_seqs": 256,
            "request_rate": 10.0, "prompt_tokens": 1000, "output_tokens": 200,
        },
        "watch": "Each layer is split across two devices: the per-device weight footprint halves, and every step "
        "pays all-reduces between them. On CPU cores the collectives cost more than the split saves.",
    },
    {
        "title": "Prefill kept off the decode path",
        "sim_watch": "8,000-token prompts on 70B: a prefill pool of 8 GPUs computes them while 8 decode GPUs keep ITL flat; the KV travels between the pools.",
        "levers": {"chunked_prefill": True, "max_batched_tokens": 256, "prompt_tokens": 1500, "request_rate": 1.0},
        "sim_levers": AT_SCALE | {
            "model": "llama-3.1-70b", "gpu_count": 16, "tensor_parallel": 4, "prefill_gpus": 8, "decode_gpus": 8,
            "paged": True, "max_num_seqs": 256, "request_rate": 2.0, "prompt_tokens": 8000, "output_tokens": 200,
            "ttft_target_ms": 2000,
        },
        "watch": "Long prompts are cut into 256-token chunks that ride along with decode steps, so itl p99 stays "
        "flat while a 1,500-token prompt is read. At scale the same goal leads to a separate prefill pool "
        "(disaggregation); this engine does it inside one replica.",
    },
)
