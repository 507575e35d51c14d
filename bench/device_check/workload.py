"""What the engine phases share: prompts as token ids and the engines they build."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.device_check.compare import free_memory
from bench.device_check.weights import ModelShape

MB = 1024 * 1024


def prompts(shape: ModelShape, lengths: list[int], seed: int) -> list[list[int]]:
    """Random token ids (the folder's tokenizer is a stand-in: prompts are ids, never text).
    Ids 0-2 (unk, bos, eos in config.json) are left out so no prompt holds an end token."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, shape.vocab, (n,), generator=gen).tolist() for n in lengths]


def greedy(max_tokens: int, logprobs: int | None = 2, prompt_logprobs: int | None = None) -> Any:
    """Greedy, exactly max_tokens long (EOS ignored), with the chosen token's logprob and the top 2
    (their gap is the margin between_engines needs)."""
    from engine import SamplingParams

    return SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs, prompt_logprobs=prompt_logprobs
    )


def kv_bytes_per_token(shape: ModelShape, elem_bytes: int) -> int:
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * elem_bytes


def budget_mb(shape: ModelShape, tokens: int, elem_bytes: int, floor_mb: float = 16.0) -> float:
    """A KV budget for `tokens` tokens with room to spare: an engine that takes all the card
    (gpu_memory_utilization) would leave none for the next engine or the HF reference."""
    return max(floor_mb, 1.5 * tokens * kv_bytes_per_token(shape, elem_bytes) / MB)


def build_llm(folder: Path, device: str, dtype: str, **levers: Any) -> Any:
    """An LLM over the folder; a lever this engine does not have yet is dropped, and said so."""
    from engine import LLM

    return LLM(str(folder), device=device, dtype=dtype, **levers)


def close(llm: Any) -> None:
    """Stop the engine and cut the LLM from it, so its tensors go now, while the caller's name for
    the LLM lives on: the next engine plans its KV from the memory this one leaves."""
    llm.engine.close()
    llm.engine = llm.tokenizer = None
    free_memory()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_steps(llm: Any, batch: list[list[int]], max_tokens: int, device: str) -> dict[str, Any]:
    """Run the batch through engine.step() one step at a time, timing each (a step returns its tokens
    to the host, so it has synchronised; sync() makes sure). Decode steps are those where every
    sequence took one token. Returns the step times and each request's tokens."""
    engine = llm.engine
    params = greedy(max_tokens, logprobs=2)
    for i, ids in enumerate(batch):
        engine.add_request(f"timed-{i}", None, params, prompt_token_ids=ids)
    seqs = {f"timed-{i}": engine.requests[f"timed-{i}"] for i in range(len(batch))}
    prefill_s, decode_s, contexts = [], [], []
    while engine.has_work():
        sync(device)
        start = time.perf_counter()
        engine.step(stream=False)
        sync(device)
        took = time.perf_counter() - start
        last = engine.last_batch
        if last.num_new_tokens and all(n == 1 for n in last.num_new_tokens):
            decode_s.append(took)
            contexts.append(sum(s.num_computed_tokens for s in last.seqs))  # after the step
        else:
            prefill_s.append(took)
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "contexts": contexts,
        "runs": [(list(s.prompt_token_ids), list(s.output_token_ids), s.output_logprobs) for s in seqs.values()],
    }


def step_figures(t: dict[str, Any]) -> dict[str, Any]:
    d = t["decode_s"]
    return {
        "prefill_steps": len(t["prefill_s"]),
        "prefill_s": round(sum(t["prefill_s"]), 6),
        "decode_steps": len(d),
        "first_decode_s": round(d[0], 6) if d else None,
        "second_decode_s": round(d[1], 6) if len(d) > 1 else None,
        "median_decode_s": round(statistics.median(d), 6) if d else None,
        "first_over_median": round(d[0] / statistics.median(d), 3) if d else None,
    }


def as_generated(runs: list[tuple[list[int], list[int], list[Any]]]) -> list[Any]:
    """timed_steps' runs as compare.Generated, margins from each position's top 2."""
    from bench.device_check.compare import Generated

    out = []
    for prompt, tokens, lps in runs:
        margins = [t.top[0][1] - t.top[1][1] for t in lps if len(t.top) >= 2]
        out.append(Generated(prompt, tokens, [t.logprob for t in lps], margins))
    return out
