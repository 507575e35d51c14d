"""Making the what-if executor faster must not change what it says: small runs' key figures,
recorded from main before the speed work (issue 12), must come out bit for bit the same.

Each spec leans on one path: over capacity (the router's queue grows), preemption (a small L4
cache, uneven lengths), reserve admission, prefix caching, and prefill/decode disaggregation."""

from __future__ import annotations

import pytest

from engine.sim.run import SimSpec, simulate

pytestmark = pytest.mark.unit

SPECS = {
    "over": SimSpec("llama-3.1-70b", "h100", gpus=16, tp=8, dtype="fp8", kv_dtype="fp8", input_tokens=1000,
                    output_tokens=250, num_requests=1500, rate=300.0),
    "preempt": SimSpec("llama-3.1-8b", "l4", gpus=2, tp=1, input_tokens=800, output_tokens=400,
                       input_range_ratio=0.5, num_requests=300, rate=50.0, seed=3),
    "reserve": SimSpec("llama-3.1-8b", "l4", gpus=1, tp=1, input_tokens=600, output_tokens=300,
                       num_requests=200, rate=20.0, admission="reserve", max_num_seqs=64),
    "prefix": SimSpec("llama-3.1-8b", "h100", gpus=2, tp=1, dtype="fp8", input_tokens=500,
                      output_tokens=100, num_requests=400, rate=80.0, prefix_caching=True, seed=1),
    "disagg": SimSpec("llama-3.1-8b", "h100", gpus=4, tp=1, dtype="fp8", input_tokens=500,
                      output_tokens=100, num_requests=300, rate=100.0, prefill_gpus=1, decode_gpus=3),
}

# (output_tok_s, ttft_p50_s, tpot_p50_s, preemptions, steps, completed), from main at d13a560
# (the cost model's constants changed since only where a comment says so).
RECORDED = {
    # "over" re-recorded at the FP8 attention of issue 29 (its FP8 KV cache): more requests admitted
    # sooner (running_max 839 -> 902), so a longer tail in this short run (36.25 -> 38.78 s).
    "over": (9669.932955131299, 9.300202573684082, 0.07711849523032355, 0, 701, 1500),
    "preempt": (401.0678434280473, 87.32336749354229, 0.09270337311144217, 184, 5210, 300),
    "reserve": (367.5344563552912, 54.18341968394873, 0.08916424887964564, 0, 1806, 200),
    "prefix": (7339.4495412845, 0.011859923649063298, 0.005291128876219181, 0, 2054, 400),
    "disagg": (8720.930232558214, 0.019082721552022452, 0.004305342848931123, 0, 2580, 300),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_key_figures_are_the_ones_recorded_before_the_speed_work(name: str) -> None:
    r = simulate(SPECS[name])
    got = (r["output_tok_s"], r["ttft_p50_s"], r["tpot_p50_s"], r["preemptions"], r["steps"], r["completed"])
    assert got == RECORDED[name]
    assert r["kv_blocks_free_at_end"]
