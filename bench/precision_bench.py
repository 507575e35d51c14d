"""What the precision levers buy in speed and capacity: the engine as served (compiled, huge pages)
in its own dtype, with int8 (W8A8) weights, and with an fp8 KV cache, on the engine bench's
workload (64 requests, prompts 50-400 tokens, 128 out, ignore_eos), alternated A B C A B C in one
process so that the machine's drift lands in the spread, not in the ratios; then one stream
(a 2,000-token prompt's TTFT, batch-1 decode). Run it with tcmalloc preloaded, as served.

`LD_PRELOAD=<tcmalloc> python -m bench.precision_bench [--isa avx2] [--rounds 2]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

CONFIGS = {"own dtype": {}, "int8 weights": {"quantization": "int8"}, "fp8 KV cache": {"kv_cache_dtype": "fp8"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.precision_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", default=None, help="cap the CPU tier (SERVELAB_CPU_ISA), e.g. avx2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args(argv)
    from engine.platform import machine  # torch-free: the cap is set before torch loads

    machine.apply_isa_override(args.isa)
    from bench.engine_bench import build_servelab, round_seed, run_servelab
    from bench.workload import time_one_stream
    from engine import SamplingParams
    from engine.launch.served import served_levers
    from engine.platform import machine

    n = args.num_requests
    print(f"{machine.cpu().describe()}; LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}", flush=True)
    engines = {name: build_servelab(True, "auto", max_num_seqs=n, **served_levers(), **CONFIGS[name]) for name in args.configs}
    for name, llm in engines.items():
        memory = llm.engine.memory
        print(f"{name}: {llm.engine.plan.summary()}; weights {memory.weight_bytes / 2**20:.0f} MiB, "
              f"KV {memory.num_kv_tokens} tokens", flush=True)  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in engines}
    steps: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        for name, llm in engines.items():
            run = run_servelab(llm, True, n, round_seed(r))
            rates[name].append(run["output_tok_s"])
            steps[name] += [seconds for seconds, _ in run["decode_steps"]]
            print(f"round {r + 1}: {name}: {run['output_tok_s']} tok/s", flush=True)
    print("| configuration | output tok/s, rounds | ratio to own dtype | batch-64 decode step (median) | TTFT, 2,000 tokens | decode at batch 1 |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|")
    base = statistics.mean(rates[args.configs[0]])
    for name, llm in engines.items():

        def generate_one(prompt: list[int], max_tokens: int, llm=llm) -> None:
            llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))

        one = time_one_stream(generate_one)
        step = statistics.median(steps[name]) * 1000 if steps[name] else float("nan")
        print(f"| {name} | {' / '.join(f'{x:.1f}' for x in rates[name])} | {statistics.mean(rates[name]) / base:.2f}x "
              f"| {step:.1f} ms | {one['ttft_2000_s'] * 1000:,.0f} ms | {one['decode_batch1_tok_s']} tok/s |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
