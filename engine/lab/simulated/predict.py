"""Predict, then run: what the simulator, with the `cpu` device `make calibrate` fitted to this
machine, expects the live lab's charts to show for the current levers, before any traffic starts.

The prediction replays the lab's own traffic law (engine/lab/traffic.py: gamma gaps at
request_rate and burstiness, lengths uniform within +-50% of the levers' means) for HORIZON_S
seconds of arrivals through the same router, queue and scheduler code, on the calibrated cost
model, with the front and the clients on the device's cores (SimSpec.front_on_device, as
bench/sim_vs_live.py matches the live server). Its timeline carries the live snapshot's own
columns over the live metrics window (engine/serving/telemetry/metrics.py WINDOW_S), so a predicted point
and a measured one at the same second mean the same thing."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import InvalidParamError
from engine.lab.facade import Executor
from engine.lab.replica_bounds import replica_bounds
from engine.serving.telemetry.metrics import WINDOW_S
from engine.sim import calibration
from engine.sim.compare import command_for
from engine.sim.deployment import SimConfigError
from engine.sim.run import SimSpec, simulate
from engine.sim.spec import spec_fields

HORIZON_S = 60.0  # seconds of arrivals the prediction covers
MAX_REQUESTS = 2000  # a faster rate predicts a shorter horizon, so the prediction stays quick
TIMELINE_S = 0.5  # a point every half second, near the live charts' density
TRAFFIC_SPREAD = 0.5  # engine/lab/traffic.py draws lengths within +-50% of the means
SEED = 0
# The live engine's levers the calibrated cpu device stands for (the model, device, TP and dtypes
# are this machine's, fixed above the levers).
LIVE_LEVERS = (
    "prompt_tokens", "output_tokens", "request_rate", "burstiness", "system_prompt_tokens", "system_prompt_share",
    "conversation_turns", "max_num_seqs", "max_batched_tokens",
    "prefix_caching", "paged", "block_size", "kv_budget_mb", "queue_cap", "deadline_s", "ttft_target_ms",
)  # fmt: skip


def live_spec(levers: dict[str, Any]) -> SimSpec:
    """The SimSpec that matches the live lab at these levers; InvalidParamError when the
    simulator's `cpu` device cannot stand for it (naming the lever that is out of its reach)."""
    if levers.get("executor", Executor.LIVE) != Executor.LIVE:
        raise InvalidParamError(
            "executor", "predict-then-run compares the simulator with the live engine: switch to live"
        )
    rate = float(levers["request_rate"])
    if rate <= 0:
        raise InvalidParamError("request_rate", "is 0 req/s: there is no traffic to predict")
    if int(levers["tensor_parallel"]) != 1:
        raise InvalidParamError(
            "tensor_parallel", "the calibrated cpu device models one unsharded replica on this machine's cores"
        )
    fewest, most = replica_bounds(levers, warm_pool_holds_devices=False)
    if most != 1:
        raise InvalidParamError(
            "max_replicas",
            f"these levers let the lab run up to {most} replicas, which split this machine's cores; the calibrated "
            "cpu device models one replica on all of them (set gpu_count or max_replicas to 1)",
        )
    horizon = min(HORIZON_S, MAX_REQUESTS / rate)
    return SimSpec(
        **spec_fields(levers, LIVE_LEVERS), model="smollm2-135m", device="cpu", gpus=fewest, tp=1, dtype="bf16",
        kv_dtype="bf16", input_range_ratio=TRAFFIC_SPREAD, num_requests=max(1, round(rate * horizon)), seed=SEED,
        front_on_device=True, timeline=True, timeline_s=TIMELINE_S,
    )


def predict(levers: dict[str, Any]) -> dict[str, Any]:
    """The predicted chart series for the live lab's levers: rows of t (seconds since the traffic
    starts), queue_depth, running, kv_used_blocks, kv_total_blocks, ttft_p50, ttft_p99 and
    tokens_per_s over the live window; plus the run's summary and the command that repeats it."""
    spec = live_spec(levers)
    try:
        result = simulate(spec)
    except SimConfigError as err:
        raise InvalidParamError("device", f"the simulator cannot predict this: {err}") from None
    horizon = spec.num_requests / spec.rate
    rows = windowed_tokens_per_s(result.pop("timeline"))
    key = calibration.this_machine()
    found = calibration.load(key)
    status = found.status(calibration.calibrating_since(key)) if found is not None else None
    badge = f"predicted: the simulator, {calibration.describe_found(key, found)}"
    return {
        "horizon_s": horizon,
        "requests": spec.num_requests,
        "command": command_for(spec) + "  # with SimSpec.front_on_device (the live server's front on these cores)",
        "badge": badge,
        "calibration": status,
        "series": [
            {
                "t": row["t"],
                "queue_depth": row["queue_depth"],
                "running": row["running"],
                "kv_used_blocks": row["kv_used_blocks"],
                "kv_total_blocks": row["kv_total_blocks"],
                "ttft_p50": row["ttft_p50_s"],
                "ttft_p99": row["ttft_p99_s"],
                "tokens_per_s": row["tokens_per_s"],
            }
            for row in rows
            if row["t"] <= horizon + 1e-9
        ],
        "summary": {k: v for k, v in result.items() if isinstance(v, (int, float))},
    }


def windowed_tokens_per_s(rows: list[dict[str, Any]], window_s: float = WINDOW_S) -> list[dict[str, Any]]:
    """Each row's output tokens/s as the live snapshot counts it: the tokens of the last window_s
    over the time since the window's first token (engine/serving/telemetry/metrics.py)."""
    times = np.array([row["t"] for row in rows])
    spans = np.diff(times, prepend=0.0)
    tokens = np.array([row["output_tok_s"] for row in rows]) * spans  # tokens of each row's interval
    for i, row in enumerate(rows):
        inside = (times > row["t"] - window_s) & (times <= row["t"]) & (tokens > 0)
        if not inside.any():
            row["tokens_per_s"] = 0.0
            continue
        first = int(np.argmax(inside))
        since = row["t"] - (times[first] - spans[first])  # from the start of the first interval with tokens
        row["tokens_per_s"] = float(tokens[inside].sum() / max(1e-3, min(window_s, since)))
    return rows
