"""What a precision lever costs in quality: the int8 (W8A8) weights and the fp8 KV cache against the
engine in its own dtype, on the project's reference prompts (tests/reference/hf_greedy.json: 13
prompts, each with the 24 tokens the fp32 engine and HF transformers pick greedily).

Both engines read the same tokens (teacher forcing): the prompt as one prefill, then the reference
continuation one decode step at a time, so every position's prediction also reads the KV cache as
a served decode does (an fp8 cache's rounding shows only there). Per position:
- greedy agreement: whether both engines' most likely next token is the same;
- KL(reference || variant) of the next-token distributions, in nats.

`python -m bench.precision_quality [--dtype float32] [--isa avx2]`: a table of both levers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "reference" / "hf_greedy.json"
VARIANTS = {"int8 weights (W8A8)": {"quantization": "int8"}, "fp8 KV cache": {"kv_cache_dtype": "fp8"}}


@dataclass(frozen=True)
class Quality:
    positions: int
    agreement: float  # share of positions whose greedy pick matches the reference engine's
    mean_kl: float  # nats
    max_kl: float

    def describe(self) -> str:
        return f"{self.agreement:.1%} greedy agreement over {self.positions} positions, mean KL {self.mean_kl:.4f} nats"


def reference_cases() -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the reference continuation's ids) of every reference prompt."""
    cases = json.loads(REFERENCE.read_text())["prompts"]
    return [(case["prompt_ids"], case["output_ids"]) for case in cases]


def next_token_logprobs(levers: dict, cases: list[tuple[list[int], list[int]]]) -> list:
    """For each case, [len(continuation), vocab] float32 log-probabilities of the next token at
    every continuation position, from an engine with these EngineConfig levers."""
    import torch

    from engine.config import EngineConfig
    from engine.worker.live_executor import load_live

    parts = load_live(EngineConfig(**levers))
    try:
        with torch.inference_mode():
            return [_teacher_forced(parts, prompt, continuation) for prompt, continuation in cases]
    finally:
        if parts.shard_group is not None:
            parts.shard_group.close()


def _teacher_forced(parts, prompt: list[int], continuation: list[int]):
    import torch

    from engine.model.llama import AttentionBatch, PrefillChunk

    model, caches = parts.model, parts.executor.runner.kv_caches
    block_size = parts.config.block_size
    i32 = torch.int32
    total = len(prompt) + len(continuation)
    table = torch.arange(-(-total // block_size), dtype=i32)

    def step(ids: list[int], start: int) -> torch.Tensor:
        n = len(ids)
        positions = torch.arange(start, start + n)
        ctx = torch.tensor([start + n], dtype=i32)
        is_decode = start > 0 and n == 1
        attn = AttentionBatch(
            slot_mapping=positions.clone(),
            num_decodes=1 if is_decode else 0,
            decode_block_tables=table[None] if is_decode else table[None, :0],
            decode_context_lens=ctx if is_decode else ctx[:0],
            prefills=[] if is_decode else [PrefillChunk(0, n, start, table)],
            block_tables=table[None],
            seq_lens=ctx,
            query_start_loc=torch.tensor([0, n], dtype=i32),
        )
        hidden = model(torch.tensor(ids), positions, attn, caches)
        return torch.log_softmax(model.compute_logits(hidden[-1:]), dim=-1)[0]

    rows = [step(prompt, 0)]
    for i, token in enumerate(continuation[:-1]):
        rows.append(step([token], len(prompt) + i))
    return torch.stack(rows)


def compare(reference: list, variant: list) -> Quality:
    """Greedy agreement and KL(reference || variant) over every position of every case."""
    agree, kls = 0, []
    for ref, var in zip(reference, variant):
        agree += int((ref.argmax(-1) == var.argmax(-1)).sum())
        kls += (ref.exp() * (ref - var)).sum(-1).clamp(min=0).tolist()
    return Quality(len(kls), agree / len(kls), sum(kls) / len(kls), max(kls))


def recorded_agreement(reference: list, cases: list[tuple[list[int], list[int]]]) -> float:
    """The share of positions where the reference engine picks the recorded continuation's token
    (the check that teacher forcing reads the cache right: 1.0 in fp32)."""
    import torch

    hits = sum(int((ref.argmax(-1) == torch.tensor(cont)).sum()) for ref, (_, cont) in zip(reference, cases))
    return hits / sum(len(cont) for _, cont in cases)


def measure(base: dict, variants: dict[str, dict]) -> tuple[float, dict[str, Quality]]:
    """(the reference engine's agreement with the recorded continuations, each variant's quality)."""
    cases = reference_cases()
    reference = next_token_logprobs(base, cases)
    results = {name: compare(reference, next_token_logprobs(base | levers, cases)) for name, levers in variants.items()}
    return recorded_agreement(reference, cases), results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.precision_quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="auto", help="the reference engine's dtype (auto: this machine's)")
    parser.add_argument("--isa", default=None, help="cap the CPU tier (SERVELAB_CPU_ISA), e.g. avx2")
    args = parser.parse_args(argv)
    from engine.platform import machine  # torch-free: the cap is set before torch loads

    machine.apply_isa_override(args.isa)
    from engine.model.int8_linear import has_int8_dot

    base = {"dtype": args.dtype, "compile": False}
    recorded, results = measure(base, VARIANTS)
    print(f"{machine.cpu().describe()}; int8 dot products: {'VNNI/AMX' if has_int8_dot() else 'none (7-bit weights)'}")
    print(f"reference engine ({args.dtype}) against the recorded greedy continuations: {recorded:.1%}")
    print("| lever | positions | greedy agreement | mean KL (nats) | max KL |")
    print("|---|---:|---:|---:|---:|")
    for name, q in results.items():
        print(f"| {name} | {q.positions} | {q.agreement:.1%} | {q.mean_kl:.4f} | {q.max_kl:.3f} |")
    return 0 if all(math.isfinite(q.mean_kl) for q in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
