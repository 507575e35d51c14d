"""What the batch_invariant lever buys and costs, on the real model in this process:
`python -m bench.batch_invariance [--prompts 100] [--max-tokens 32] [--max-num-seqs 64] [--dtype bfloat16]
[--threads N] [--json]`.

For each setting (off, on): the first prompt's raw logits alone and inside a full batch (bitwise
equal or not, and the largest difference), and over every prompt how many greedy generations
change a token between run alone and run all together. Then the throughput it costs: the whole
batch generated A B A B (off, on, off, on) in one process, output tokens per second each round."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from engine.llm import LLM
from engine.sampling_params import SamplingParams

COLOURS = ("red", "blue", "green", "teal", "amber", "violet", "grey", "ochre")


def make_prompts(n: int) -> list[str]:
    return [
        f"Question {i}: in one sentence, what is special about the number {i * 7} and the colour {COLOURS[i % 8]}?"
        for i in range(n)
    ]


def first_logits(llm: LLM, prompts: list[str], tag: str) -> torch.Tensor:
    """prompts[0]'s raw logits at its first sampled token, with every prompt in one batch."""
    engine = llm.engine
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for request_id, text in zip(ids, prompts):
        engine.add_request(request_id, text, SamplingParams(temperature=0, max_tokens=1))
    found = None
    while engine.has_work():
        engine.step()
        rows, logits = engine.runner.last_logits or ([], None)
        if found is None and ids[0] in rows and logits is not None:
            found = logits[rows.index(ids[0])].clone()
    assert found is not None
    return found


def correctness(llm: LLM, prompts: list[str], max_num_seqs: int, max_tokens: int) -> dict[str, Any]:
    alone = first_logits(llm, prompts[:1], "alone")
    batched = first_logits(llm, prompts[:max_num_seqs], "batch")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    one_by_one = [llm.generate(p, params)[0].token_ids for p in prompts]
    together = [out.token_ids for out in llm.generate(prompts, params)]
    return {
        "logits_bitwise_equal": bool(torch.equal(alone, batched)),
        "logits_max_abs_diff": float((alone - batched).abs().max()),
        "generations_changed": sum(a != b for a, b in zip(one_by_one, together)),
        "generations": len(prompts),
    }


def throughput(llm: LLM, prompts: list[str], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs of the throughput run")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    prompts = make_prompts(args.prompts)
    engines = {
        inv: LLM(
            batch_invariant=inv,
            dtype=args.dtype,
            max_num_seqs=args.max_num_seqs,
            prefix_caching=False,
            num_threads=args.threads,
            kv_budget_mb=256,
        )
        for inv in (False, True)
    }  # no prefix cache: every run computes every prompt, alone or batched
    result: dict[str, Any] = {
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
    }
    for inv, llm in engines.items():
        result["on" if inv else "off"] = correctness(llm, prompts, args.max_num_seqs, args.max_tokens)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.rounds):  # A B A B: drift on a shared machine hits both alike
        for inv, llm in engines.items():
            rates["on" if inv else "off"].append(throughput(llm, prompts, args.max_tokens))
    for key, values in rates.items():
        result[key]["output_tok_s"] = [round(v, 1) for v in values]
    result["throughput_on_over_off"] = round(statistics.median(rates["on"]) / statistics.median(rates["off"]), 3)
    if args.json:
        print(json.dumps(result))
    else:
        for key in ("off", "on"):
            r = result[key]
            print(
                f"batch_invariant {key}: logits alone vs in a batch of {args.max_num_seqs} "
                f"{'bitwise equal' if r['logits_bitwise_equal'] else 'differ'} (max |diff| {r['logits_max_abs_diff']:.3g}); "
                f"{r['generations_changed']}/{r['generations']} generations change a token; "
                f"output tok/s {r['output_tok_s']}"
            )
        print(f"throughput on / off: {result['throughput_on_over_off']}")
    for llm in engines.values():
        llm.engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
