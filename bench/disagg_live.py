"""Prefill/decode disaggregation on this machine (issue 43): the same cores as two colocated
replicas, or as one prefill replica handing each prompt's KV to one decode replica. Running
streams (short prompts, long answers) are joined by long prompts at intervals; each long prompt's
prefill stalls every stream that shares its replica's step, unless the prompt is prefilled
elsewhere. Reported: the streams' inter-token gaps (p50, p99, max), the long prompts' TTFT (the
split's includes the handoff), output tokens/s, and the handoffs' bytes and export time.

    python -m bench.disagg_live [--streams 4] [--long-prompts 4] [--long-tokens 2000] [--rounds 1]

Each configuration is its own fleet of replica processes, started and stopped in turn (colocated
first); nothing else should run. Times are the engine's own stamps (RequestTimes), gaps between
deliveries as the metrics bus counts them."""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from itertools import pairwise
from typing import Any

from engine.config import EngineConfig
from engine.launch.served import served_levers
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import RequestError, TokenDelta
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig

STREAM_PROMPT = 64


def _collect(events: queue.Queue, out: dict[str, Any], key: str) -> None:
    while True:
        event = events.get(timeout=600)
        if isinstance(event, RequestError):
            out[key] = event
            return
        assert isinstance(event, TokenDelta)
        if event.finished:
            out[key] = event
            return


def run_config(split: bool, args: argparse.Namespace) -> dict[str, float]:
    config = EngineConfig(**(served_levers() | {"kv_budget_mb": 256.0, "max_num_seqs": 32}))
    fleet_config = FleetConfig(replicas=1 if split else 2, decode_replicas=1 if split else 0, drain_timeout_s=5)
    fleet = Fleet(config, RouterConfig(queue_cap=1000), fleet_config)
    try:
        deadline = time.monotonic() + 300
        while not (fleet.ready and all(r.state == ReplicaState.READY for r in fleet.replicas + fleet.downstream())):
            if time.monotonic() > deadline:
                raise RuntimeError("the replicas did not get ready")
            time.sleep(0.2)
        results: dict[str, Any] = {}
        threads = []
        started = time.perf_counter()
        stream_params = SamplingParams(temperature=0, max_tokens=args.stream_tokens, ignore_eos=True)
        for i in range(args.streams):
            ids = [1000 + 37 * i + j for j in range(STREAM_PROMPT)]
            events = fleet.submit(f"stream-{i}", ids, stream_params, None)
            threads.append(threading.Thread(target=_collect, args=(events, results, f"stream-{i}")))
        for t in threads:
            t.start()
        time.sleep(args.warm_s)  # the streams are decoding
        long_params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        for i in range(args.long_prompts):
            ids = [2000 + 53 * i + j % 40000 for j in range(args.long_tokens)]
            events = fleet.submit(f"long-{i}", ids, long_params, None)
            t = threading.Thread(target=_collect, args=(events, results, f"long-{i}"))
            t.start()
            threads.append(t)
            time.sleep(args.gap_s)
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        errors = [k for k, v in results.items() if isinstance(v, RequestError)]
        if errors:
            raise RuntimeError(f"requests failed: {errors}: {[results[k].message for k in errors]}")
        gaps: list[float] = []
        for i in range(args.streams):
            tokens = results[f"stream-{i}"].times.tokens
            gaps += [b - a for a, b in pairwise(tokens) if b > a]
        gaps.sort()
        ttfts = [results[f"long-{i}"].times.first_token - results[f"long-{i}"].times.arrival for i in range(args.long_prompts)]
        output = sum(len(r.times.tokens) for r in results.values())
        bus = fleet.bus
        return {
            "itl_p50_ms": 1000 * statistics.median(gaps),
            "itl_p99_ms": 1000 * gaps[min(len(gaps) - 1, round(0.99 * (len(gaps) - 1)))],
            "itl_max_ms": 1000 * gaps[-1],
            "long_ttft_p50_s": statistics.median(ttfts),
            "long_ttft_max_s": max(ttfts),
            "output_tok_s": output / wall,
            "handoffs": bus.kv_handoffs,
            "handoff_mb": bus.kv_handoff_bytes / 1e6,
            "handoff_export_ms": 1000 * bus.kv_handoff_s / max(1, bus.kv_handoffs),
        }
    finally:
        fleet.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=4, help="running streams (short prompts, long answers)")
    parser.add_argument("--stream-tokens", type=int, default=160)
    parser.add_argument("--long-prompts", type=int, default=4)
    parser.add_argument("--long-tokens", type=int, default=2000)
    parser.add_argument("--gap-s", type=float, default=2.0, help="seconds between long prompts")
    parser.add_argument("--warm-s", type=float, default=2.0, help="seconds the streams run before the first long prompt")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print("config      ITL p50 ms  ITL p99 ms  ITL max ms  long TTFT p50 s  max s  output tok/s  handoffs  MB  export ms")
    for _ in range(args.rounds):
        for split in (False, True):
            r = run_config(split, args)
            name = "split 1+1" if split else "colocated 2"
            print(
                f"{name:<11} {r['itl_p50_ms']:>10.1f}  {r['itl_p99_ms']:>10.1f}  {r['itl_max_ms']:>10.1f}  "
                f"{r['long_ttft_p50_s']:>15.2f}  {r['long_ttft_max_s']:>5.2f}  {r['output_tok_s']:>12.1f}  "
                f"{r['handoffs']:>8}  {r['handoff_mb']:>4.0f}  {r['handoff_export_ms']:>9.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
