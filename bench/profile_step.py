"""Where a step's time goes: torch-profiler tables for one prefill-heavy step and for batch-64
decode steps of the benchmark workload, and for one 2,000-token prompt's prefill, in the recommended configuration `make bench` runs
(compiled forward; `--eager` for the op-by-op view, `--int8` for int8 weights). `make profile` (tcmalloc preloaded, as in
`make bench`)."""

from __future__ import annotations

import sys

from torch.profiler import profile

from bench.workload import LONG_PROMPT_TOKENS, OUTPUT_TOKENS, _prompt, make_workload
from engine import LLM, SamplingParams


def main() -> int:
    # --int8: the quantization=int8 engine (W8A8 linears)
    quantization = "int8" if "--int8" in sys.argv else "none"
    llm = LLM(max_num_seqs=64, compile="--eager" not in sys.argv, huge_pages=True, adaptive_threads=False, quantization=quantization)
    engine = llm.engine
    llm.generate(make_workload(8, 8, seed=1), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    params = SamplingParams(temperature=0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    for i, req in enumerate(make_workload()):
        engine.add_request(f"p{i}", None, params, prompt_token_ids=req["prompt_token_ids"])
    engine.step()
    with profile() as prof:
        engine.step()
    batch = engine.last_batch
    print(f"== one prefill step: {batch.num_tokens} tokens, {len(batch.seqs)} sequences ==")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    while engine.last_batch.num_tokens != 64:
        engine.step()
    with profile() as prof:
        for _ in range(5):
            engine.step()
    print("== five decode steps, batch 64 ==")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    while engine.has_work():
        engine.step()
    # One long prompt alone (the engine bench's TTFT case): linears against prefill attention.
    long_prompt = _prompt(LONG_PROMPT_TOKENS, seed=2)
    engine.add_request("long", None, SamplingParams(temperature=0, max_tokens=1), prompt_token_ids=long_prompt)
    with profile() as prof:
        while engine.has_work():
            engine.step()
    print(f"== one {len(long_prompt)}-token prompt's prefill ==")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
