"""The live engine's host share of a step (issue 42): decode steps at batch 1 and at a full batch
(max_num_seqs), each step's StepRecord split into the model's part (the forward and sampling, as
the runner timed them) and the host's (scheduling, building inputs, processing outputs,
detokenising), as the batch chart draws them. Eager by default, as LLM() runs; `--served` runs the
engine as `make run` serves it (compiled forward, huge pages).

    python -m bench.host_share [--served] [--steps N]
"""

from __future__ import annotations

import argparse
import sys

from bench.workload import make_workload
from engine import LLM, SamplingParams
from engine.core.llm_engine import LLMEngine
from engine.core.step_record import StepRecord
from engine.launch.served import SERVED_LEVERS


def decode_steps(engine: LLMEngine, batch: int, steps: int) -> list[StepRecord]:
    """`steps` decode steps of `batch` sequences, once every prompt is read; their records."""
    params = SamplingParams(temperature=0, max_tokens=steps + 64, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for request_id, req in zip(ids, make_workload(batch, seed=3)):
        engine.add_request(request_id, None, params, prompt_token_ids=req["prompt_token_ids"][:120])
    assert engine.step_records is not None
    while True:  # the prompts' steps, then a first decode step of the whole batch
        engine.step()
        last = engine.step_records.take()[-1]
        if len(last.entries) == batch and all(e.phase == "decode" for e in last.entries):
            break
    for _ in range(steps):
        engine.step()
    records = engine.step_records.take()
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_work():
        engine.step()
    engine.step_records.take()
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--served", action="store_true", help="compiled forward and huge pages, as make run serves")
    parser.add_argument("--steps", type=int, default=64, help="decode steps measured at each batch")
    args = parser.parse_args()
    llm = LLM(**(SERVED_LEVERS if args.served else {}))
    engine = llm.engine
    full = engine.config.max_num_seqs
    decode_steps(engine, full, 8)  # warm up: allocator, threads, any compile at this shape
    print(f"{engine.plan.summary() if engine.plan else ''}; {'served' if args.served else 'eager'}")
    print("batch  step ms  model ms  host ms  host share")
    for batch in (1, full):
        records = decode_steps(engine, batch, args.steps)
        span = sum(r.end - r.start for r in records)
        host = sum(r.host_s for r in records)
        n = len(records)
        print(
            f"{batch:5d}  {1e3 * span / n:7.2f}  {1e3 * (span - host) / n:8.2f}  {1e3 * host / n:7.2f}  {host / span:9.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
