"""`python -m engine.sim run --model M --device D --gpus G --tp T ... [--json]` (DESIGN.md's
what-if contract) and `python -m engine.sim plan --model M --rate R --ttft-p99-ms T --tpot-p99-ms P
...` (the cheapest shape that meets both SLOs, the frontier, the launch commands: engine/sim/plan.py).
A configuration that cannot run exits 2 with the reason on stderr."""

from __future__ import annotations

import argparse
import json
import sys

from engine.sim.deployment import KV_DTYPES, WEIGHT_DTYPES, SimConfigError
from engine.sim.host_profiles import HOST_PROFILES
from engine.sim.plan_cli import add_plan_parser, run_plan_command
from engine.sim.run import SimSpec, simulate

CONTRACT_KEYS = (
    "output_tok_s", "output_tok_s_per_gpu", "request_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "itl_p99_s", "e2el_p50_s", "goodput_req_s", "kv_usage_max", "preemptions", "replicas", "simulated_s", "wall_s",
    "prefix_hit_rate",
)


def _rate(text: str) -> float:
    value = float(text)  # "inf" parses
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive or inf")
    return value


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError("must be true or false")
    return text.lower() == "true"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.sim", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="simulate one serving run")
    r.add_argument("--model", required=True, type=str.lower)
    r.add_argument("--device", required=True, type=str.lower)
    r.add_argument("--gpus", type=int, default=1)
    r.add_argument("--tp", type=int, default=1, help="tensor parallel: GPUs sharing every layer (inside a node)")
    r.add_argument("--pp", type=int, default=1,
                   help="pipeline parallel: stages of contiguous layers, a TP group each; a replica takes tp x pp GPUs")
    r.add_argument("--pp-overlap", type=_bool, default=True,
                   help="as many batches in flight as stages (vLLM's); false: one at a time, the bubble shows")
    r.add_argument("--dtype", type=str.lower, default="bf16", help=f"weights: {', '.join(WEIGHT_DTYPES)}")
    r.add_argument("--kv-dtype", type=str.lower, default=None, help=f"{', '.join(KV_DTYPES)} (default: as --dtype)")
    r.add_argument("--input-tokens", type=int, default=1000)
    r.add_argument("--output-tokens", type=int, default=1000)
    r.add_argument("--input-range-ratio", type=float, default=0.0)
    r.add_argument("--num-requests", type=int, default=1000)
    r.add_argument("--rate", type=_rate, default=float("inf"), help="requests/s, or inf (all at once)")
    r.add_argument("--concurrency", type=int, default=None,
                   help="closed loop: N clients, each sending its next request when its last ends (vLLM's "
                        "--max-concurrency; with --rate, the rate's arrivals wait for a free client)")
    r.add_argument("--burstiness", type=float, default=1.0)
    r.add_argument("--system-prompt-tokens", type=int, default=0,
                   help="a shared system prompt of this many tokens at the head of the prompts that carry it, "
                        "inside --input-tokens (its cache hits need --prefix-caching true)")
    r.add_argument("--system-prompt-share", type=float, default=1.0, help="the share of requests carrying it")
    r.add_argument("--conversation-turns", type=int, default=1,
                   help="turns per conversation: an arrival continues the oldest answered conversation, resending "
                        "its last prompt and answer before its own part")
    r.add_argument("--burst-factor", type=float, default=1.0, help="the rate times this during the burst")
    r.add_argument("--burst-at-s", type=float, default=0.0, help="simulated second the burst begins")
    r.add_argument("--burst-s", type=float, default=0.0, help="how long the burst lasts (simulated s)")
    r.add_argument("--kv-budget-mb", type=float, default=None, help="KV cache per GPU (default: what memory leaves)")
    r.add_argument("--max-num-seqs", type=int, default=1024)
    r.add_argument("--max-batched-tokens", type=int, default=8192)
    r.add_argument("--admission", choices=("greedy", "reserve"), default="greedy",
                   help="greedy: vLLM (preempt when full); reserve: TensorRT-LLM's guaranteed-no-evict")
    r.add_argument("--kv-watermark", type=float, default=0.0,
                   help="greedy admission takes a prompt only if all of it fits with this share of the KV blocks "
                        "left free (vLLM v0's --watermark rule, 0.01 there); 0: its first chunk is enough (vLLM v1)")
    r.add_argument("--prefix-caching", type=_bool, default=False)
    r.add_argument("--prefill-first", type=_bool, default=False,
                   help="a step of prompts alone whenever one can run, else the decodes alone (vLLM v0 without "
                        "chunked prefill, SGLang 0.3); false: prompts join the running decodes' step")
    r.add_argument("--scheduler-steps", type=int, default=1,
                   help="a decode-only batch runs N steps per schedule, its tokens delivered together at the end "
                        "(vLLM 0.6's --num-scheduler-steps)")
    r.add_argument("--host-profile", choices=HOST_PROFILES, default="default",
                   help="the engine's host work per step (engine/sim/host_profiles.py): default, a fixed overhead; "
                        "python-2024 serial, vllm-0.6-multistep, overlapped: Vidur's measured costs by batch and TP")
    r.add_argument("--num-speculative-tokens", type=int, default=0,
                   help="speculative decoding: guesses each decode checks per step (0: off; vLLM's "
                        "num_speculative_tokens)")
    r.add_argument("--spec-acceptance", type=float, default=SimSpec.spec_acceptance,
                   help="the chance a guess stands once those before it did: what the drafter achieves on the traffic")
    r.add_argument("--spec-draft-cost", type=float, default=0.0,
                   help="a draft pass's time over the target model's step (0: n-gram lookup; a draft model's ratio)")
    r.add_argument("--paged", type=_bool, default=True, help="false: static batches, contiguous max-length KV")
    r.add_argument("--block-size", type=int, default=SimSpec.block_size, help="KV block size in tokens")
    r.add_argument("--prefill-gpus", type=int, default=None, help="with --decode-gpus: disaggregated pools")
    r.add_argument("--decode-gpus", type=int, default=None)
    r.add_argument("--ttft-slo-ms", type=float, default=None)
    r.add_argument("--queue-cap", type=int, default=None, help="the router's queue bound (default: every request)")
    r.add_argument("--central-queue", type=_bool, default=True,
                   help="requests wait in the router until a replica has room; false: each goes to a replica on "
                        "arrival, as a bare engine's server takes it")
    r.add_argument("--prefix-aware-routing", type=_bool, default=True,
                   help="a prompt goes to the replica caching its prefix; false: prefix-blind, equal loads take turns")
    r.add_argument("--deadline-s", type=float, default=None, help="a queued request expires after this long")
    r.add_argument("--tpot-slo-ms", type=float, default=None)
    r.add_argument("--kill-replica-at", type=float, default=None, help="simulated second replica 0 fails")
    r.add_argument("--seed", type=int, default=0)
    a = r.add_argument_group("autoscaling", "the real Fleet and Autoscaler over simulated replicas")
    a.add_argument("--autoscale", type=_bool, default=False, help="start at --min-replicas and scale with load")
    a.add_argument("--min-replicas", type=int, default=SimSpec.min_replicas)
    a.add_argument("--max-replicas", type=int, default=None, help="default: every TP group --gpus holds")
    a.add_argument("--warm-pool", type=int, default=SimSpec.warm_pool, help="loaded idle replicas (out of --gpus)")
    a.add_argument("--provision-delay-s", type=float, default=SimSpec.provision_delay_s,
                   help="a cold start waits this long for its machine, then loads the weights")
    a.add_argument("--storage-gbs", type=float, default=SimSpec.storage_bw / 1e9,
                   help="GB/s each GPU reads its weight shard at (engine/sim/constants.py STORAGE_BW)")
    a.add_argument("--timeline-s", type=float, default=SimSpec.timeline_s, help="one timeline row per this long")
    a.add_argument("--settle", type=_bool, default=False,
                   help="after the last request, run on until the fleet has drained back to --min-replicas")
    r.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_plan_parser(sub)
    return p


def spec_from(args: argparse.Namespace) -> SimSpec:
    kv = args.kv_dtype or ("bf16" if args.dtype == "fp4" else args.dtype)
    names = (
        "gpus", "tp", "pp", "input_tokens", "output_tokens", "num_requests", "max_num_seqs", "max_batched_tokens",
        "block_size", "scheduler_steps",
    )
    for name in names:
        if getattr(args, name) < 1:
            raise SimConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if (args.queue_cap is not None and args.queue_cap < 1) or (args.deadline_s is not None and not args.deadline_s > 0):
        raise SimConfigError("--queue-cap must be at least 1 and --deadline-s positive")
    if not 0 <= args.input_range_ratio < 1:
        raise SimConfigError("--input-range-ratio must be in [0, 1)")
    if not 0 <= args.kv_watermark < 1:
        raise SimConfigError("--kv-watermark must be in [0, 1)")
    return SimSpec(
        model=args.model, device=args.device, gpus=args.gpus, tp=args.tp, pp=args.pp,
        pp_overlap=args.pp_overlap, dtype=args.dtype, kv_dtype=kv,
        input_tokens=args.input_tokens, output_tokens=args.output_tokens, input_range_ratio=args.input_range_ratio,
        num_requests=args.num_requests, rate=args.rate, concurrency=args.concurrency, burstiness=args.burstiness,
        burst_factor=args.burst_factor,
        burst_at_s=args.burst_at_s, burst_s=args.burst_s, kv_budget_mb=args.kv_budget_mb, max_num_seqs=args.max_num_seqs,
        max_batched_tokens=args.max_batched_tokens, ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms,
        system_prompt_tokens=args.system_prompt_tokens, system_prompt_share=args.system_prompt_share,
        conversation_turns=args.conversation_turns,
        prefix_aware_routing=args.prefix_aware_routing,
        seed=args.seed, admission=args.admission, kv_watermark=args.kv_watermark, prefix_caching=args.prefix_caching, paged=args.paged,
        prefill_first=args.prefill_first, scheduler_steps=args.scheduler_steps, central_queue=args.central_queue,
        host_profile=args.host_profile, spec_tokens=args.num_speculative_tokens, spec_acceptance=args.spec_acceptance, spec_draft_cost=args.spec_draft_cost,
        block_size=args.block_size, queue_cap=args.queue_cap, deadline_s=args.deadline_s,
        kill_replica_at_s=args.kill_replica_at, prefill_gpus=args.prefill_gpus, decode_gpus=args.decode_gpus,
        autoscale=args.autoscale, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        warm_pool=args.warm_pool, provision_delay_s=args.provision_delay_s, storage_bw=args.storage_gbs * 1e9,
        timeline_s=args.timeline_s, settle=args.settle,
    )


def table(result: dict) -> str:
    rows = ["{:=^56}".format(" Simulated serving run ")]
    closed = ("concurrency", "in_flight_max") if "concurrency" in result else ()
    for key in CONTRACT_KEYS + ("completed", "refused") + closed:
        value = result[key]
        rows.append(f"{key:<28} {value:>14.4f}" if isinstance(value, float) else f"{key:<28} {value!s:>14}")
    for row in result.get("timeline", []):  # autoscaled: replicas by state over time
        states = ", ".join(f"{k} {v}" for k, v in sorted(row["replicas"].items()))
        rows.append(f"t={row['t']:>8.1f} s  queue {row['queue_depth']:>5}  {row['output_tok_s']:>9.0f} tok/s  {states}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "plan":
        return run_plan_command(args)
    try:
        result = simulate(spec_from(args))
    except SimConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
