"""The CPU attention paths against each other in one process, interleaved (A B A B), so a shared,
noisy machine moves them alike: `python -m bench.attention_cpu_bench [--rounds N]`.

Variants: "torch" (the reference: gather + batched matmul, SDPA for prefill), "cpu" (the C++ op
reading blocks in place) and, with --compile, "cpu+compile" (the same forward through Inductor;
a second engine, since compilation is per replica). Cases, each a whole engine step: a batch-64
decode step of the engine bench's workload (mean context about 300), a batch-1 decode step at
context 500, and a 2,000-token prefill. Prints median ms per case and the ratios to torch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from bench.workload import make_workload
from engine import LLM, SamplingParams
from engine.core.llm_engine import LLMEngine

Case = Callable[[LLMEngine], float]


def timed_step(engine: LLMEngine) -> float:
    start = time.perf_counter()
    engine.step()
    return time.perf_counter() - start


def decode_batch(requests: list[dict], prefix: str) -> Callable[[LLMEngine], None]:
    """Submits the requests and steps until every one is decoding (all prefills done)."""

    def setup(engine: LLMEngine) -> None:
        params = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
        for i, req in enumerate(requests):
            engine.add_request(f"{prefix}{i}", None, params, prompt_token_ids=req["prompt_token_ids"])
        while engine.last_batch.num_tokens != len(requests):
            engine.step()

    return setup


def prefill_step(engine: LLMEngine, tokens: list[int], rid: str) -> float:
    engine.add_request(rid, None, SamplingParams(temperature=0, max_tokens=1), prompt_token_ids=tokens)
    took = timed_step(engine)
    while engine.has_work():
        engine.step()
    return took


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3, help="decode steps timed per round and variant")
    parser.add_argument("--compile", action="store_true", help="add the compiled forward")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 on a shared machine)")
    args = parser.parse_args(argv)
    if args.threads:
        # On a shared machine one thread per engine avoids OpenMP barriers stalling on busy cores.
        torch.set_num_threads(args.threads)

    engines: dict[str, LLMEngine] = {}
    base = LLM(dtype="bfloat16", max_num_seqs=64, max_batched_tokens=2048, prefix_caching=False, compile=False).engine
    engines["torch"], engines["cpu"] = base, base
    if args.compile:
        start = time.perf_counter()
        engines["cpu+compile"] = LLM(
            dtype="bfloat16", max_num_seqs=64, max_batched_tokens=2048, prefix_caching=False, compile=True
        ).engine
        print(f"compiled engine ready in {time.perf_counter() - start:.1f} s")

    def use(name: str) -> LLMEngine:
        engine = engines[name]
        engine.model.attention_impl = "torch" if name == "torch" else "cpu"
        return engine

    long_prompt = [t for req in make_workload(16, seed=7) for t in req["prompt_token_ids"]][:2000]
    assert len(long_prompt) == 2000
    results: dict[str, dict[str, list[float]]] = {}
    for case in ("decode, batch 64", "decode, batch 1", "prefill, 2000 tokens"):
        per = {name: [] for name in engines}
        for name in dict.fromkeys(engines, None):  # set-up and warm-up (for compile, the first shapes)
            engine = use(name)
            if case == "decode, batch 64" and name != "cpu":  # torch and cpu share an engine
                decode_batch(make_workload(), f"{name}-b64-")(engine)
            elif case == "decode, batch 1" and name != "cpu":
                decode_batch([{"prompt_token_ids": long_prompt[:500]}], f"{name}-b1-")(engine)
            elif case.startswith("prefill"):
                prefill_step(engine, long_prompt[:2000], f"{name}-pw")
            if case.startswith("decode"):
                timed_step(engine)
        for r in range(args.rounds):
            for name in engines:
                engine = use(name)
                if case.startswith("decode"):
                    # torch and cpu share an engine: each round's steps run on the batch as it stands.
                    per[name].extend(timed_step(engine) for _ in range(args.steps))
                else:
                    per[name].append(prefill_step(engine, long_prompt[:2000], f"{name}-p{r}"))
        for engine in set(engines.values()):
            _drain(engine)
        results[case] = per

    names = list(engines)
    ratios = " | ".join(f"{n} speed-up" for n in names[1:])
    print("| case | " + " | ".join(f"{n} ms" for n in names) + f" | {ratios} |")
    print("| --- " * (2 * len(names)) + "|")  # speed-up: torch's median over the variant's
    for case, per in results.items():
        med = {n: statistics.median(per[n]) * 1e3 for n in names}
        ratios = " | ".join(f"{med['torch'] / med[n]:.2f}x" for n in names[1:])
        print(f"| {case} | " + " | ".join(f"{med[n]:.1f}" for n in names) + f" | {ratios} |")
    return 0


def _drain(engine: LLMEngine) -> None:
    """Aborts every request the engine holds, so the next case starts empty."""
    for rid in list(engine.requests):
        engine.abort(rid)
    engine.step()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
