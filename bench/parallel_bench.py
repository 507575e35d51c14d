"""`python -m bench.parallel_bench` (`make bench-tp`): one replica's model over this machine's cores
as one rank, two tensor-parallel ranks, two pipeline stages (overlap on and off) and two stages of
two TP ranks: output tokens/s under a closed load, each stage's busy time per step and idle share
(the bubble), and the weights and KV one rank of each stage holds.

The load: `--requests` requests at once, each a `--prompt`-token prompt and `--output` tokens
(greedy, ignore_eos), driven through the engine's own step loop; tokens/s counts output tokens over
the whole run; the per-stage figures are the engine's (engine/parallel/collectives.py StageClock, over the
latest 5 s) read halfway through the decode, at steady state. On a 2-core CPU each stage (or rank)
gets one core where one rank used both: the point is not speed but where the time goes, with two
batches in flight against one."""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

MB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"tp1": (1, 1, True), "tp2": (2, 1, True), "pp2": (1, 2, True), "pp2-no-overlap": (1, 2, False),
          "tp2xpp2": (2, 2, True)}  # fmt: skip


def measure(name: str, dtype: str, cap_mb: float, requests: int, prompt: int, output: int) -> dict:
    from engine import LLM, SamplingParams

    tp, pp, overlap = SHAPES[name]
    llm = LLM(dtype=dtype, tensor_parallel=tp, pipeline_parallel=pp, pipeline_overlap=overlap,
              memory_cap_mb=cap_mb, max_num_seqs=requests, adaptive_threads=False)  # fmt: skip
    engine = llm.engine
    try:
        llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm up
        params = SamplingParams(temperature=0, max_tokens=output, ignore_eos=True)
        for i in range(requests):
            engine.add_request(f"r{i}", None, params, prompt_token_ids=[1, *range(100 + i, 100 + i + prompt - 1)])
        start, tokens, mid = time.perf_counter(), 0, None
        while engine.has_work():
            tokens += sum(len(out.new_token_ids) for out in engine.step())
            if mid is None and tokens >= requests * output // 2:
                mid = engine.stats()
        elapsed = time.perf_counter() - start
        end = engine.stats()
    finally:
        engine.close()
    assert mid is not None
    return {
        "shape": name,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "overlap": overlap,
        "output_tok_s": round(tokens / elapsed, 1),
        "elapsed_s": round(elapsed, 2),
        "steps": end.num_steps,
        "stage_layers": mid.pp_stage_layers or [30],
        "stage_busy_ms_per_step": [round(x, 2) for x in mid.pp_stage_busy_ms_per_step],
        "stage_idle_share": [round(x, 3) for x in mid.pp_stage_idle_share],
        "stage_weight_mb": [round(b / MB, 1) for b in mid.pp_stage_weight_bytes],
        "rank0_weight_mb": round(mid.tp_rank_weight_bytes[0] / MB, 1),
        "kv_blocks": end.kv_total_blocks,
        "stage_kv_mb": [round(b * end.kv_total_blocks / MB, 1) for b in mid.pp_stage_kv_block_bytes],
        "allreduce_ms_per_step": round(mid.allreduce_ms_per_step, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--memory-cap-mb", type=float, default=1024.0)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--output", type=int, default=192)
    parser.add_argument("--out", default=str(ROOT / ".cache" / "parallel-bench.json"))
    args = parser.parse_args()
    rows = [measure(s, args.dtype, args.memory_cap_mb, args.requests, args.prompt, args.output) for s in args.shapes.split(",")]
    base = rows[0]["output_tok_s"]
    print(f"dtype {args.dtype}, memory cap {args.memory_cap_mb:.0f} MB per rank, {args.requests} requests of "
          f"{args.prompt} + {args.output} tokens at once")  # fmt: skip
    print(f"{'shape':<15} {'tok/s':>7} {'x tp1':>6} {'stage busy ms/step':>20} {'stage idle':>12} "
          f"{'stage weights MB':>17} {'KV blocks':>9} {'stage KV MB':>13}")  # fmt: skip
    for r in rows:
        busy = "/".join(f"{x:.1f}" for x in r["stage_busy_ms_per_step"]) or "-"
        idle = "/".join(f"{x:.0%}" for x in r["stage_idle_share"]) or "-"
        weights = "/".join(f"{x:.0f}" for x in r["stage_weight_mb"])
        kv = "/".join(f"{x:.0f}" for x in r["stage_kv_mb"])
        print(f"{r['shape']:<15} {r['output_tok_s']:>7.1f} {r['output_tok_s'] / base:>6.2f} {busy:>20} {idle:>12} "
              f"{weights:>17} {r['kv_blocks']:>9} {kv:>13}")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    out.write_text(json.dumps({"when": when, "args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
