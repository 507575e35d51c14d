"""The C++ attention op's prefill paths alone, over 30 layers' caches shaped like SmolLM2's (9
query heads, 3 KV heads, head_dim 64, bf16, blocks of 16, shuffled): AMX tiles
(engine/kernels/csrc/prefill_amx.cpp), torch's CPU flash attention over gathered blocks (SDPA),
and the op's own AVX-512 loops. `python -m bench.prefill_attention_bench [--threads N]`.

Cases: a 2,048-token prefill step of the engine bench's prompts (9 sequences of 50-400 tokens),
one 2,000-token prompt, a 512-token chunk after 1,536 cached. The paths alternate round by
round (A B C A B C) in one process; prints each one's median ms per step and the ratios."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from engine.kernels import cpu_attention

KV_HEADS, HEADS, HEAD_DIM, BLOCK, LAYERS = 3, 9, 64, 16, 30
PATHS = {"amx": {"sdpa_from": cpu_attention.AMX_FROM, "amx": True}, "sdpa": {"sdpa_from": 1, "amx": False},
         "loops": {"sdpa_from": 0, "amx": False}}  # fmt: skip


def batch(chunks: list[tuple[int, int]], g: torch.Generator) -> tuple:
    """(cached, new) tokens per sequence: q and caches with shuffled blocks, and the metadata."""
    ctxs = [c + n for c, n in chunks]
    blocks = [(n + BLOCK - 1) // BLOCK for n in ctxs]
    num_blocks = sum(blocks) + 4
    order = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(len(ctxs), max(blocks), dtype=torch.int32)
    at = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = order[at : at + n].int()
        at += n
    shape = (KV_HEADS, num_blocks, BLOCK, HEAD_DIM)  # heads outermost, as engine/worker/runner.py keeps them
    caches = [
        tuple(torch.randn(shape, generator=g).bfloat16().permute(1, 2, 0, 3) for _ in range(2)) for _ in range(LAYERS)
    ]
    news = [n for _, n in chunks]
    q = torch.randn(sum(news), HEADS, HEAD_DIM, generator=g).bfloat16()
    starts = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32)
    return q, caches, tables, torch.tensor(ctxs, dtype=torch.int32), starts


def step(work: tuple, kw: dict) -> float:
    """Seconds for one step's attention, every layer, on one path."""
    q, caches, tables, lens, starts = work
    t = time.perf_counter()
    for kc, vc in caches:
        cpu_attention.paged_attention(q, kc, vc, tables, lens, starts, HEAD_DIM**-0.5, **kw)
    return time.perf_counter() - t


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not cpu_attention.available():
        print("the C++ op is not built: make kernels")
        return 1
    paths = dict(PATHS) if cpu_attention.has_amx() else {k: v for k, v in PATHS.items() if k != "amx"}
    torch.set_num_threads(args.threads)
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    step_prompts: list[int] = []
    while sum(step_prompts) < 2048 - 400:
        step_prompts.append(rng.randint(50, 400))
    step_prompts.append(2048 - sum(step_prompts))
    cases = {
        f"2,048-token step ({len(step_prompts)} prompts)": [(0, n) for n in step_prompts],
        "one 2,000-token prompt": [(0, 2000)],
        "512 tokens after 1,536 cached": [(1536, 512)],
    }
    print(f"{args.threads} thread(s), {LAYERS} layers, AMX {'on this CPU' if 'amx' in paths else 'absent'}")
    for name, chunks in cases.items():
        work = batch(chunks, g)
        times: dict[str, list[float]] = {p: [] for p in paths}
        for p, kw in paths.items():
            step(work, kw)  # warm
        for _ in range(args.rounds):
            for p, kw in paths.items():
                times[p].append(step(work, kw))
        med = {p: statistics.median(ts) * 1e3 for p, ts in times.items()}
        ratios = ", ".join(f"{p} {med[p] / med[next(iter(paths))]:.2f}x" for p in paths)
        print(f"{name}: " + ", ".join(f"{p} {ms:.1f} ms" for p, ms in med.items()) + f" ({ratios} the first)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
