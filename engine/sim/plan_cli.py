"""The `plan` subcommand's flags and its run: a PlanQuery from the command line, the plan as one
JSON object on stdout (or a short table), progress on stderr; a query that cannot run exits 2."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.levers import parse_bool
from engine.sim.deployment import SimConfigError
from engine.sim.plan import run_plan
from engine.sim.plan_space import PlanQuery


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in text.split(",") if part.strip())


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("each must be at least 1")
    return values


def _prices(text: str) -> tuple[tuple[str, float], ...]:
    out = []
    for part in text.split(","):
        name, _, price = part.partition("=")
        try:
            value = float(price)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: write device=USD, e.g. h100=2.5") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{part!r}: a price must be positive")
        out.append((name.strip().lower(), value))
    return tuple(out)


def add_plan_parser(sub: Any) -> None:
    d = PlanQuery
    p = sub.add_parser("plan", help="search shapes for the cheapest that meets the SLOs, and the frontier")
    p.add_argument("--model", required=True, type=str.lower)
    traffic = p.add_mutually_exclusive_group(required=True)
    traffic.add_argument("--rate", type=float, help="requests/s (Poisson arrivals)")
    traffic.add_argument("--concurrency", type=int,
                         help="or: this many clients, each sending its next request when its last one ends")
    p.add_argument("--input-tokens", type=int, default=1000)
    p.add_argument("--output-tokens", type=int, default=250)
    p.add_argument("--input-range-ratio", type=float, default=0.0, help="lengths spread uniformly by +-this share")
    p.add_argument("--ttft-slo-ms", required=True, type=float)
    p.add_argument("--tpot-slo-ms", required=True, type=float)
    p.add_argument("--devices", type=_names, default=d.devices, help="comma-separated, e.g. h100,h200,b200")
    p.add_argument("--max-gpus", type=int, default=d.max_gpus)
    p.add_argument("--gpu-hour-usd", type=_prices, default=(), help="device=USD per GPU-hour, comma-separated "
                   "(defaults: engine/sim/constants.py GPU_HOUR_USD)")
    p.add_argument("--dtypes", type=_names, default=d.dtypes, help="weight dtypes to consider (fp4 runs on b200 only)")
    p.add_argument("--tp", type=_ints, default=d.tp)
    p.add_argument("--pp", type=_ints, default=d.pp)
    p.add_argument("--batch-slots", type=_ints, default=d.batch_slots, help="max_num_seqs values")
    p.add_argument("--disaggregation", type=parse_bool, default=d.disaggregation, help="also try prefill/decode splits")
    p.add_argument("--duration-s", type=float, default=d.duration_s,
                   help=f"simulated arrivals per candidate ({d.MIN_REQUESTS}-{d.MAX_REQUESTS} requests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--json", action="store_true", help="the whole plan as one JSON object on stdout")


def query_from(args: argparse.Namespace) -> PlanQuery:
    return PlanQuery(
        model=args.model, rate=args.rate, concurrency=args.concurrency, input_tokens=args.input_tokens,
        output_tokens=args.output_tokens, ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms, devices=args.devices, max_gpus=args.max_gpus,
        gpu_hour_usd=args.gpu_hour_usd, input_range_ratio=args.input_range_ratio, dtypes=args.dtypes, tp=args.tp,
        pp=args.pp, batch_slots=args.batch_slots, disaggregation=args.disaggregation, duration_s=args.duration_s,
        seed=args.seed,
    )


def table(plan: dict[str, Any]) -> str:
    s = plan["search"]
    rows = [
        (
            f"{s['evaluated']} shapes simulated on {s['lines']} lines in {s['wall_s']:.1f} s "
            f"({s['enumerated']} enumerated, {s['unfit']} do not fit, {s['too_slow_by_bound']} too slow by the bound, "
            f"{s['idle']} with idle replicas by Little's law)"
        ),
        plan["verdict"],
        "frontier (tok/s/GPU, tok/s/user, TTFT p99, TPOT p99, $/M tokens, shape):",
    ]
    for p in plan["frontier"]:
        rows.append(
            f"  {p['output_tok_s_per_gpu']:8.0f} {p['tok_s_per_user']:7.1f} {p['ttft_p99_s'] * 1000:7.0f} ms "
            f"{p['tpot_p99_s'] * 1000:6.1f} ms ${p['usd_per_m_tokens']:7.3f}  {p['family']}, {p['replicas']} x TP{p['tp']}"
            + (f" x PP{p['pp']}" if p["pp"] > 1 else "") + f", {p['max_num_seqs']} slots"
        )
    launch = (plan["cheapest"] or plan["closest"] or {}).get("launch") or {}
    for server in ("vllm", "sglang"):
        for entry in launch.get(server, []):
            rows.append(f"{server} ({entry['role']}, {entry['servers']} x {entry['gpus_each']} GPUs): {entry['command']}")
    return "\n".join(rows)


def run_plan_command(args: argparse.Namespace) -> int:
    def progress(done: int, total: int) -> None:
        print(f"\rplan: {done}/{total} lines", end="" if done < total else "\n", file=sys.stderr, flush=True)

    try:
        plan = run_plan(query_from(args), args.workers, progress).to_json()
    except SimConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(plan) if args.json else table(plan))
    return 0
