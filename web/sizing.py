"""This machine's serving capacity, from its measured figures, so a lesson can size its load.

A lesson writes a rate relative to capacity (`request_rate: 2x capacity`) and the page resolves
it from the figures it shows (this machine's, else the reference's): "comfortable", "at the
knee" and "overloaded" then mean the same on a two-core AVX2 laptop and on an AMX server.

The model is two measured costs and one fit. A request's share of a saturated engine is its
prefill plus its output tokens at a full batch's cost per token:

    ms(P, O) = c + a*P + b*P^2 + O * decode_step_b64_ms / 64

fitted through two measurements: the engine bench served with every request at once
(`ramp_all_req_s`: prompts uniform in 50-400 tokens, 128 out), whose per-request time less its
decode share is its mean prefill, and one 2,048-token prefill (`prefill_2048_ms`; the P^2 term is
attention reading the prompt so far). Two points fix a and b with c = 0. Where they do not fit
both non-negative (a short prompt costing more per token than a long one: a fixed cost per request,
the server's and the scheduler's, that the long prompt hides), the long prompt's own rate sets a
(b = 0) and the rest of the short prompts' mean is c, a cost per request. Either way the bench's
shape gives `ramp_all_req_s` exactly; elsewhere it is an estimate (max_num_seqs, preemption are
not in it), and the pages say "about"."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# The engine bench's shape (bench/workload.py), which `ramp_all_req_s` was measured on.
BENCH_PROMPT_RANGE = (50, 400)
BENCH_OUTPUT_TOKENS = 128
FULL_BATCH = 64  # decode_step_b64_ms's batch
LONG_PROMPT = 2048  # prefill_2048_ms's prompt
# The lab draws each length uniformly within +-50% of its mean (engine/lab/traffic.py), so a mean
# P's E[P^2] is P^2 * (1 + 0.5^2 / 3).
LAB_SQUARE_FACTOR = 1 + 0.25 / 3
NEEDS = ("ramp_all_req_s", "decode_step_b64_ms", "prefill_2048_ms")
RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*x\s+capacity\s*$")
RELATIVE_LEVERS = ("request_rate", "rate_limit")


@dataclass(frozen=True)
class CapacityModel:
    prefill_ms_per_token: float  # a
    prefill_ms_per_token_sq: float  # b
    decode_ms_per_token: float
    per_request_ms: float = 0.0  # c

    def request_ms(self, prompt_tokens: float, output_tokens: float, square_factor: float = LAB_SQUARE_FACTOR) -> float:
        p = float(prompt_tokens)
        prefill = self.prefill_ms_per_token * p + self.prefill_ms_per_token_sq * p * p * square_factor
        return self.per_request_ms + prefill + float(output_tokens) * self.decode_ms_per_token

    def req_s(self, prompt_tokens: float, output_tokens: float) -> float:
        """Requests a second this machine serves at saturation, at these mean lengths."""
        return 1000.0 / self.request_ms(prompt_tokens, output_tokens)


def fit(figures: Mapping[str, float]) -> CapacityModel:
    """The model from the three figures (KeyError naming one that is missing)."""
    req_s, step64, prefill_long = (float(figures[name]) for name in NEEDS)
    decode = step64 / FULL_BATCH
    low, high = BENCH_PROMPT_RANGE
    mean_p = (low + high) / 2
    mean_p2 = mean_p**2 + (high - low) ** 2 / 12  # uniform prompt lengths
    bench_prefill = 1000.0 / req_s - BENCH_OUTPUT_TOKENS * decode
    # a * mean_p + b * mean_p2 = bench_prefill;  a * L + b * L^2 = prefill_long
    det = mean_p * LONG_PROMPT**2 - mean_p2 * LONG_PROMPT
    a = (bench_prefill * LONG_PROMPT**2 - mean_p2 * prefill_long) / det
    b = (mean_p * prefill_long - LONG_PROMPT * bench_prefill) / det
    if a >= 0 and b >= 0:
        return CapacityModel(a, b, decode)
    if b < 0:  # short prompts dearer per token than the long one: a cost per request
        a = prefill_long / LONG_PROMPT
        return CapacityModel(a, 0.0, decode, max(0.0, bench_prefill - a * mean_p))
    b = prefill_long / LONG_PROMPT**2  # a < 0: all in the square term, the rest per request
    return CapacityModel(0.0, b, decode, max(0.0, bench_prefill - b * mean_p2))


def relative_factor(value: object) -> float | None:
    """2.0 for "2x capacity"; None for anything else."""
    match = RELATIVE.match(value) if isinstance(value, str) else None
    return float(match.group(1)) if match else None


def resolve_rates(levers: Mapping[str, object], lengths: Mapping[str, object], model: CapacityModel) -> dict:
    """levers with each `Nx capacity` rate replaced by N x capacity at `lengths`' prompt_tokens and
    output_tokens, to two decimals (and at least 0.01)."""
    out = dict(levers)
    for key in RELATIVE_LEVERS:
        factor = relative_factor(out.get(key))
        if factor is not None:
            capacity = model.req_s(float(lengths["prompt_tokens"]), float(lengths["output_tokens"]))  # type: ignore[arg-type]
            out[key] = max(0.01, round(factor * capacity, 2))
    return out
