"""The sampled pick on one step's logits (batch 64 x SmolLM2's 49,152 tokens, bf16, temperature 1):
the exponential race the sampler used before (argmax of p / Exp(1) noise, one exponential_ per
row), torch's inverse CDF (the sampler's fallback), and the C++ sample_pick (its CPU path).

`python -m bench.sampler_bench [--rows 64] [--threads 2]`: milliseconds per step's pick, medians."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from engine.kernels import cpu_attention
from engine.sampler import draw_torch


def exponential_race(logits: torch.Tensor, inv_temps: torch.Tensor) -> torch.Tensor:
    """The previous sampler's draw: fp32 copy, softmax, one exponential_ call per row."""
    probs = torch.softmax(logits.float() * inv_temps[:, None], dim=-1)
    noise = torch.empty_like(probs)
    for row in range(probs.shape[0]):
        noise[row].exponential_()
    return (probs / noise).max(dim=-1).indices


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
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
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
    print(f"{args.rows} rows x {args.vocab} bf16 logits, {args.threads} threads, median of {args.rounds}:")
    for name, ms in results.items():
        print(f"  {name:30} {ms:8.2f} ms  ({before / ms:5.1f}x the race)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
