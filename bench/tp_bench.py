"""`python -m bench.tp_bench`: tensor parallelism on this machine, degree 1 against 2, same cores.

For each degree: the weights one rank holds, the KV blocks its memory cap then buys (each rank
gets memory_cap_mb; fewer weights and fewer KV heads per rank leave room for more blocks), the
decode step time at a fixed batch, and the all-reduce time inside that step (2 per layer).

On a 2-core CPU, t=2 gives each rank one core where t=1 used both, so the matmuls take as long
as before in all, and every step adds 60 gloo all-reduces of one small hidden state each (about
0.5-1 ms apiece here, loopback TCP plus the wait for the slower rank): t=2 is slower. That is the
lesson about collectives: tensor parallelism pays where a link is fast (NVLink: microseconds) and
one device cannot hold the model or the KV cache the batch needs; the freed memory's extra KV
blocks are what can make a wider degree the throughput-optimal one, not the compute.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path
from typing import Any

MB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent


def measure(degree: int, dtype: str, cap_mb: float, batch: int, steps: int) -> dict:
    from engine import LLM, SamplingParams

    llm = LLM(dtype=dtype, tensor_parallel=degree, memory_cap_mb=cap_mb, max_num_seqs=batch)
    engine = llm.engine
    try:
        llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm up
        params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"tp-{i}", None, params, prompt_token_ids=[1, *range(100 + i, 164 + i)])
        step_ms = []
        while engine.has_work():
            start = time.perf_counter()
            engine.step()
            elapsed = time.perf_counter() - start
            if engine.last_batch.num_tokens == batch == len(engine.last_batch.seqs):
                step_ms.append(elapsed * 1e3)
        stats = engine.stats()
    finally:
        engine.close()
    per_rank = stats.tp_rank_weight_bytes
    return {
        "tensor_parallel": degree,
        "rank_weight_mb": [round(b / MB, 1) for b in per_rank],
        "kv_blocks": stats.kv_total_blocks,
        "kv_tokens": stats.kv_total_blocks * engine.config.block_size,
        "kv_bytes_per_token_per_rank": stats.kv_bytes_per_token,
        "decode_step_ms": round(statistics.median(step_ms), 2),
        "allreduce_ms_per_step": round(stats.allreduce_ms_per_step, 2),
        "allreduces_per_step": stats.allreduces_per_step,
    }


def _allreduce_rank(rank: int, port: int, shape: tuple[int, int], count: int, result: Any) -> None:
    import torch
    import torch.distributed as dist

    from engine.platform.machine import affinity, set_affinity

    set_affinity([affinity()[rank % len(affinity())]])
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    x = torch.ones(shape, dtype=torch.bfloat16)
    for _ in range(20):
        dist.all_reduce(x)
    start = time.perf_counter()
    for _ in range(count):
        dist.all_reduce(x)
    if rank == 0:
        result.put((time.perf_counter() - start) / count * 1e3)
    dist.destroy_process_group()


def allreduce_alone_ms(batch: int, hidden: int = 576, count: int = 600) -> float:
    """One gloo all-reduce of a [batch, hidden] bf16 hidden state between two single-core ranks,
    with no model around it: the floor of what each of a step's 60 all-reduces costs."""
    import multiprocessing as mp

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, store.port, (batch, hidden), count, result)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    ms = result.get(timeout=120)
    for proc in procs:
        proc.join(30)
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degrees", default="1,2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--memory-cap-mb", type=float, default=1024.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default=str(ROOT / ".cache" / "tp-bench.json"))
    args = parser.parse_args()
    rows = [measure(int(d), args.dtype, args.memory_cap_mb, args.batch, args.steps) for d in args.degrees.split(",")]
    print(f"{args.dtype}, memory cap {args.memory_cap_mb:.0f} MB per rank, decode batch {args.batch}")
    print(f"{'t':>2} {'weights/rank MB':>18} {'KV blocks':>9} {'step ms':>8} {'all-reduce ms':>13} {'share':>6}")
    for r in rows:
        share = r["allreduce_ms_per_step"] / r["decode_step_ms"] if r["decode_step_ms"] else 0.0
        weights = "/".join(f"{w:.0f}" for w in r["rank_weight_mb"])
        print(
            f"{r['tensor_parallel']:>2} {weights:>18} {r['kv_blocks']:>9} {r['decode_step_ms']:>8.1f} "
            f"{r['allreduce_ms_per_step']:>13.1f} {share:>6.0%}"
        )
    alone = allreduce_alone_ms(args.batch)
    print(
        f"one all-reduce of a [{args.batch}, 576] hidden state alone: {alone:.2f} ms; "
        f"x {rows[-1]['allreduces_per_step']} a step = {alone * rows[-1]['allreduces_per_step']:.1f} ms. "
        "The rest of the in-step all-reduce time is waiting for the slower rank."
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    report = {"when": when, "args": vars(args), "rows": rows, "allreduce_alone_ms": alone}
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
