"""`make figures`' groups for the steps past the guide's seven: speculative decoding (lesson 11)
and prefill/decode disaggregation (lesson 10), each measured in the engine as `make run` serves it."""

from __future__ import annotations

import statistics


def measure_spec(pairs: int = 3) -> dict[str, float]:
    """Speculative decoding (lesson 11): bench/spec_decode.py's quoting prompts at batch 1 and 16,
    greedy, 128 tokens each, k = 4, in the engine as served: `pairs` runs plain then speculating,
    alternated, the medians kept (one pair moved 1.30x-1.53x at batch 1 on this noisy VM)."""
    from bench.figures import _llm
    from bench.spec_decode import run

    llm = _llm()
    run(llm, 2, 16, 4)  # the verify pass's shapes, warmed
    out: dict[str, float] = {}
    for batch in (1, 16):
        plains, specs, ratios, kept, per_step = [], [], [], [], []
        for _ in range(pairs):
            plain_out, plain, _, _ = run(llm, batch, 128, 0)
            spec_out, spec, share, tokens = run(llm, batch, 128, 4)
            assert [o.token_ids for o in spec_out] == [o.token_ids for o in plain_out], "speculation changed the text"
            plains.append(plain), specs.append(spec), ratios.append(spec / plain)
            kept.append(share), per_step.append(tokens)
        median = statistics.median
        out |= {f"spec_b{batch}_plain_tok_s": median(plains), f"spec_b{batch}_tok_s": median(specs),
                f"spec_b{batch}_ratio": median(ratios)}  # fmt: skip
        if batch == 1:
            out |= {"spec_b1_kept": median(kept), "spec_b1_tokens_per_step": median(per_step)}
    return out


def measure_disagg() -> dict[str, float]:
    """Prefill/decode disaggregation (lesson 10): bench/disagg_live.py's streams and long prompts
    on two colocated replicas, then on one prefill and one decode replica (the same cores)."""
    import argparse as _argparse

    from bench.disagg_live import run_config

    args = _argparse.Namespace(streams=4, stream_tokens=160, long_prompts=4, long_tokens=2000, gap_s=2.0, warm_s=2.0)
    colocated, split = run_config(False, args), run_config(True, args)
    return {
        "disagg_colocated_itl_p99_ms": colocated["itl_p99_ms"], "disagg_split_itl_p99_ms": split["itl_p99_ms"],
        "disagg_itl_p99_ratio": colocated["itl_p99_ms"] / split["itl_p99_ms"],
        "disagg_colocated_ttft_s": colocated["long_ttft_p50_s"], "disagg_split_ttft_s": split["long_ttft_p50_s"],
        "disagg_colocated_tok_s": colocated["output_tok_s"], "disagg_split_tok_s": split["output_tok_s"],
        "disagg_export_ms": split["handoff_export_ms"],
    }  # fmt: skip
