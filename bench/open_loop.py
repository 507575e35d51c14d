"""The engine alone under a benchmark client's arrival pattern: requests of `--prompt` random
tokens and `--output` tokens arrive every 1/`--rate` s (greedy, ignore_eos), and the script counts
how many finish inside `--window` s, as guidellm's max_duration would, with no client, HTTP or
tokenizer in the process. It tells the engine's capacity apart from the client's cost.

    python -m bench.open_loop [--threads 2] [--rate 2] [--prompt 180] [--output 48] [--window 15]
    SERVELAB_CPU_ISA=avx2 python -m bench.open_loop --threads 1
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--prompt", type=int, default=180, help="tokens (guidellm's 150 plus the chat template)")
    ap.add_argument("--output", type=int, default=48)
    ap.add_argument("--window", type=float, default=15.0)
    args = ap.parse_args()

    from engine import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    engine = LLM(adaptive_threads=False, prefix_caching=False).engine
    n = int(args.rate * args.window)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(args.prompt)] for _ in range(n)]
    params = SamplingParams(temperature=0, max_tokens=args.output, ignore_eos=True)
    start = time.perf_counter()
    sent, finished, steps = 0, {}, []
    while len(finished) < n:
        now = time.perf_counter() - start
        while sent < n and sent / args.rate <= now:
            engine.add_request(f"r{sent}", None, params, prompt_token_ids=prompts[sent])
            sent += 1
        if not engine.has_work():
            time.sleep(0.002)
            continue
        t = time.perf_counter()
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = time.perf_counter() - start
        batch = engine.last_batch
        steps.append((time.perf_counter() - t, batch.num_tokens, len(batch.seqs)))
    latency = [finished[f"r{i}"] - i / args.rate for i in range(n)]
    within = sum(1 for i in range(n) if finished[f"r{i}"] <= args.window)
    decode = [s[0] for s in steps if s[1] == s[2]]
    mixed = [s for s in steps if s[1] > s[2]]
    plan = engine.plan
    print(
        f"{plan.dtype if plan else '?'} {plan.linear if plan else ''} {plan.attention if plan else ''}, {args.threads} threads"
    )
    print(
        f"finished inside {args.window:.0f} s: {within}/{n}; latency median {statistics.median(latency):.2f} s, max {max(latency):.2f} s"
    )
    if decode:
        print(f"decode-only steps: {len(decode)}, median {statistics.median(decode) * 1000:.0f} ms")
    if mixed:
        rate = sum(s[1] for s in mixed) / sum(s[0] for s in mixed)
        print(f"steps carrying prefill: {len(mixed)}, {rate:.0f} tokens/s through them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
