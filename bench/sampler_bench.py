"""The sampled pick on one step's logits (batch 64 x SmolLM2's 49,152 tokens, bf16, temperature 1):
the exponential race the sampler used before (argmax of p / Exp(1) noise, one exponential_ per
row), torch's inverse CDF (the sampler's fallback), and the C++ sample_pick (its CPU path); then
top-k 50 and top-p 0.9 rows: the full sort the filters used before against the sampler's
candidates (its largest 1,024 logits, a full sort only for rows they do not cover).

`python -m bench.sampler_bench [--rows 64] [--threads 2] [--model-logits]`: milliseconds per
step's pick, medians. --model-logits: the real model's logits for 64 short text prompts (the
filters' candidates hold a peaked row; random logits are flat, and top-p then sorts every row)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from engine.kernels import cpu_attention
from engine.sample.sampler import _filtered_draw, draw_torch

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "Explain how a CPU cache works.",
           "In 1905, Albert Einstein", "The best way to learn a language is", "Here is a recipe for bread:",
           "SELECT * FROM"]  # fmt: skip


def exponential_race(logits: torch.Tensor, inv_temps: torch.Tensor) -> torch.Tensor:
    """The previous sampler's draw: fp32 copy, softmax, one exponential_ call per row."""
    probs = torch.softmax(logits.float() * inv_temps[:, None], dim=-1)
    noise = torch.empty_like(probs)
    for row in range(probs.shape[0]):
        noise[row].exponential_()
    return (probs / noise).max(dim=-1).indices


def sort_filter(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """The previous filters: the whole row sorted, top-k and top-p masks, scattered back."""
    sorted_logits, order = logits.float().sort(dim=-1, descending=True)
    drop = (torch.arange(logits.shape[-1]) >= (k or logits.shape[-1])).expand(logits.shape[0], -1).clone()
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    drop |= probs.cumsum(dim=-1) - probs >= p
    return torch.empty_like(sorted_logits).scatter_(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def model_logits(rows: int) -> torch.Tensor:
    """One decode step's logits of the real model over the text prompts, bf16 as the runner has them."""
    from engine import LLM, SamplingParams

    llm = LLM(dtype="bfloat16", max_num_seqs=rows)
    engine = llm.engine
    for i in range(rows):
        engine.add_request(f"b{i}", PROMPTS[i % len(PROMPTS)], SamplingParams(temperature=1.0, max_tokens=8, seed=i))
    while engine.has_work():
        engine.step()
        _, raw = engine.runner.last_logits
        if raw.shape[0] == rows:
            return raw.clone()
    raise RuntimeError("no step sampled every row")


def median_ms(fn: Callable[[], object], rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--model-logits", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    if args.model_logits:
        logits = model_logits(args.rows)
    else:
        logits = (torch.randn(args.rows, args.vocab, generator=gen) * 3).bfloat16()
    inv_temps = torch.ones(args.rows)
    uniforms = torch.rand(args.rows, dtype=torch.float64, generator=gen)
    variants: dict[str, Callable[[], object]] = {
        "exponential race (before)": lambda: exponential_race(logits, inv_temps),
        "torch inverse CDF (fallback)": lambda: draw_torch(logits, inv_temps, uniforms),
    }
    if cpu_attention.available():
        variants["C++ sample_pick"] = lambda: cpu_attention.sample_pick(logits, inv_temps, uniforms)
    results = {name: median_ms(fn, args.rounds) for name, fn in variants.items()}
    before = results["exponential race (before)"]
    source = "the model's" if args.model_logits else "random"
    print(
        f"{logits.shape[0]} rows x {logits.shape[1]} {source} bf16 logits, {args.threads} threads, median of {args.rounds}:"
    )
    for name, ms in results.items():
        print(f"  {name:30} {ms:8.2f} ms  ({before / ms:5.1f}x the race)")
    rows = logits.shape[0]
    floats = logits.float()
    for label, k, p in (("top-k 50", 50, 1.0), ("top-p 0.9", 0, 0.9)):
        ks, ps, mins = [k] * rows, [p] * rows, [0.0] * rows
        whole = median_ms(lambda k=k, p=p: sort_filter(logits, k, p), max(3, args.rounds // 3))
        ours = median_ms(lambda ks=ks, ps=ps, mins=mins: _filtered_draw(floats, ks, ps, mins, uniforms), args.rounds)
        print(f"  {label}: full sort (before) {whole:7.2f} ms, candidates {ours:7.2f} ms ({whole / ours:4.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
