"""The five evolution scenario cards, in the System Design Lab's order: each sets levers on the
live engine and says what to watch."""

from __future__ import annotations

EVOLUTION = (
    {
        "title": "One device, one request at a time",
        "levers": {"paged": False, "max_num_seqs": 1, "request_rate": 1.0, "prompt_tokens": 200, "output_tokens": 64},
        "watch": "Static batches of one: running never exceeds 1, the queue grows whenever two requests overlap, "
        "and tokens/s is one sequence's decode speed. The weights are read once per token for a single user.",
    },
    {
        "title": "KV cache with static batching",
        "levers": {"paged": False, "max_num_seqs": 16, "request_rate": 2.0},
        "watch": "Sixteen requests share each weight read, so tokens/s climbs. But a batch only ends when its "
        "longest member does: batch_size sags as short requests finish and new ones wait for the whole batch. "
        "Each slot reserves KV for prompt plus max output up front.",
    },
    {
        "title": "Continuous batching + paged attention",
        "levers": {"paged": True, "max_num_seqs": 64, "request_rate": 2.0},
        "watch": "Requests join and leave the batch every step, so batch_size tracks demand and the queue drains "
        "as soon as anything finishes. KV blocks are taken as tokens arrive: kv_blocks holds only real tokens.",
    },
    {
        "title": "Tensor-parallel sharding",
        "levers": {"gpu_count": 2, "tensor_parallel": 2, "paged": True},
        "watch": "Each layer is split across two devices: the per-device weight footprint halves, and every step "
        "pays all-reduces between them. On CPU cores the collectives cost more than the split saves.",
    },
    {
        "title": "Prefill kept off the decode path",
        "levers": {"chunked_prefill": True, "max_batched_tokens": 256, "prompt_tokens": 1500, "request_rate": 1.0},
        "watch": "Long prompts are cut into 256-token chunks that ride along with decode steps, so itl p99 stays "
        "flat while a 1,500-token prompt is read. At scale the same goal leads to a separate prefill pool "
        "(disaggregation); this engine does it inside one replica.",
    },
)
