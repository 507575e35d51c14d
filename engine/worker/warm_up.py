"""Warm a live engine before its server says it is ready, so the first user's request is answered
as fast as the hundredth: oneDNN builds a kernel for each new row count a linear meets (about 5 ms
each for a decode's here, 50 ms for a prefill's), and the first call of everything else pays too."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from engine.core.scheduler import SchedulerOutput
from engine.model.compile import warm_linears
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.core.llm_engine import LLMEngine

log = logging.getLogger("servelab.engine")

WARM_UP_PROMPT = 64  # tokens of the warm-up request: a prefill like a user's, cheap on any CPU
WARM_UP_ID = "__warm_up__"


def warm_up(engine: LLMEngine, prompt_tokens: int = WARM_UP_PROMPT, output_tokens: int = 4) -> float:
    """One short greedy request through the whole step loop, then the linears at every decode
    batch size. It leaves no trace: prefix caching is off for it, and the step count and step
    records are as they were. A compiled engine has warmed already (compile_model). Returns the
    seconds it took."""
    model = engine.model
    if model is None or model.compiled_forward is not None:
        return 0.0
    start = time.perf_counter()
    caching, engine.kv.enable_prefix_caching = engine.kv.enable_prefix_caching, False
    try:
        length = min(prompt_tokens, engine.max_model_len - output_tokens - 1)
        ids = [i % engine.model_cfg.vocab_size for i in range(1, length + 1)]
        params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
        engine.add_request(WARM_UP_ID, None, params, prompt_token_ids=ids)
        while engine.has_work():
            engine.step(stream=False)
        warm_linears(model, engine.config.max_num_seqs)
        if model.embed.is_cuda and model.attention_impl != "torch":  # Triton's split-K variants
            from engine.kernels.triton_attention import warm_decode_variants

            k_cache, v_cache = engine.runner.kv_caches[0]
            max_blocks = -(-engine.max_model_len // engine.config.block_size)
            warm_decode_variants(k_cache, v_cache, model.cfg.num_heads, max_blocks)
    finally:
        engine.kv.enable_prefix_caching = caching
        engine.num_steps = 0
        engine.last_batch = SchedulerOutput()
        if engine.step_records is not None:
            engine.step_records.take()
    took = time.perf_counter() - start
    log.info("warm-up: %.1f s", took)
    return took
