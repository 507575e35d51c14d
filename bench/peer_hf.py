"""Hugging Face transformers baseline on the shared benchmark workload; prints one JSON line.

Run with the main .venv from the repo root: `python -m bench.peer_hf [--num-requests N]`.
Naive static batching, as a plain transformers user would do it: requests in workload order, in
fixed batches of 16, left-padded, greedy, each batch running until all its rows have 128 tokens.
Needs the HF folder from bench/export_hf.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from bench.workload import NUM_REQUESTS, make_workload

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / ".cache" / "smollm2-hf"
BATCH_SIZE = 16
# bfloat16 is the faster here: on this 2-core AVX512-BF16 CPU a 16x~225-token batch generated
# ~3x faster in bf16 than in fp32 (70 vs 23-28 tok/s, 16 new tokens). It is also what vLLM runs.
DEFAULT_DTYPE = "bfloat16"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def left_pad(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left padding keeps every row's last prompt token at the end, where generate appends."""
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[row, width - len(ids) :] = 1
    return input_ids, mask


def run_batch(model: torch.nn.Module, batch: list[dict], pad_id: int) -> int:
    """Generate for one static batch; returns the number of new tokens produced."""
    new_tokens = batch[0]["max_tokens"]
    input_ids, mask = left_pad([r["prompt_token_ids"] for r in batch], pad_id)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        do_sample=False,
        # min == max blocks EOS: the transformers way of the workload's ignore_eos.
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=pad_id,
    )
    return int(out[:, input_ids.shape[1] :].numel())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--num-requests", type=int, default=NUM_REQUESTS)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=DEFAULT_DTYPE)
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        print(f"no HF model at {args.model}; run `python -m bench.export_hf`", file=sys.stderr)
        return 2

    workload = make_workload(num_requests=args.num_requests)
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=DTYPES[args.dtype])
    model.eval()
    pad_id = model.config.pad_token_id
    if pad_id is None:
        pad_id = model.config.eos_token_id
    batches = [workload[i : i + BATCH_SIZE] for i in range(0, len(workload), BATCH_SIZE)]

    with torch.inference_mode():
        # Warm-up: first calls pay one-off allocator and kernel-selection costs.
        warm = make_workload(num_requests=2, output_tokens=4, seed=1)
        run_batch(model, warm, pad_id)
        start = time.perf_counter()
        output_tokens = sum(run_batch(model, batch, pad_id) for batch in batches)
        seconds = time.perf_counter() - start

    result = {
        "system": "hf-transformers",
        "output_tokens": output_tokens,
        "seconds": round(seconds, 3),
        "output_tok_s": round(output_tokens / seconds, 1),
        "version": transformers.__version__,
        "num_requests": args.num_requests,
        "dtype": args.dtype,
        "batch_size": BATCH_SIZE,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
