"""The recommended shape: the stage of the architecture path the levers call for, and why."""

from __future__ import annotations

import dataclasses

import pytest

from engine.lab.shape import TRADEOFFS, ShapeInputs, Stage, min_tensor_parallel, recommend

pytestmark = pytest.mark.unit

GB = 10**9
# Llama-3.1-8B in bf16 on one H100 (80 GB label, 85.9 GB of memory), a 1000/200-token workload.
BASE = ShapeInputs(
    request_rate=1.0, prompt_tokens=1000, output_tokens=200, ttft_target_s=1.0, tensor_parallel=1,
    device="H100", device_memory_bytes=80 * GB, weight_bytes_total=16 * GB, min_tensor_parallel=1,
    decode_step_s=0.004,
)


def test_one_request_at_a_time_while_less_than_one_is_in_flight() -> None:
    shape = recommend(BASE)  # 1 req/s x 200 tokens x 4 ms = 0.8 in flight
    assert shape.stage == Stage.ONE_REQUEST
    assert "0.8 requests in flight" in shape.reasons[0]


def test_batching_then_continuous_batching_as_concurrency_grows() -> None:
    assert recommend(dataclasses.replace(BASE, request_rate=3.0)).stage == Stage.BATCHING  # 2.4 in flight
    shape = recommend(dataclasses.replace(BASE, request_rate=20.0))  # 16 in flight
    assert shape.stage == Stage.CONTINUOUS_PAGED and "paged" in shape.reasons[0]


def test_weights_beyond_one_device_call_for_sharding_and_name_the_degree() -> None:
    big = dataclasses.replace(BASE, weight_bytes_total=141 * GB, min_tensor_parallel=2)
    shape = recommend(big)
    assert shape.stage == Stage.TENSOR_PARALLEL
    assert "weights 141 GB > 80 GB per H100: shard, TP >= 2" in shape.reasons
    sharded = recommend(dataclasses.replace(big, tensor_parallel=8))
    assert "weights 141 GB > 80 GB per H100: shard, TP >= 2 (TP8 here: 17.6 GB per H100)" in sharded.reasons
    none_fits = recommend(dataclasses.replace(big, weight_bytes_total=810 * GB, min_tensor_parallel=None))
    assert none_fits.stage == Stage.TENSOR_PARALLEL and "fp8 or two nodes" in none_fits.reasons[-1]


def test_long_prompts_over_the_ttft_target_with_decode_headroom_split_prefill_from_decode() -> None:
    long = dataclasses.replace(BASE, prompt_tokens=16000, ttft_p99_s=2.5, ttft_target_s=0.5, decode_ratio=0.2)
    shape = recommend(long)
    assert shape.stage == Stage.DISAGGREGATED
    assert "TTFT p99 2500 ms over the 500 ms target while decode has headroom (20% of its roofline)" in shape.reasons[-1]
    # Decode saturated too: splitting would not help; short prompts: the queue is the cost.
    assert recommend(dataclasses.replace(long, decode_ratio=0.9)).stage < Stage.DISAGGREGATED
    short = recommend(dataclasses.replace(long, prompt_tokens=200))
    assert short.stage < Stage.DISAGGREGATED and "add replicas" in short.reasons[-1]
    # Within the target: no split.
    assert recommend(dataclasses.replace(long, ttft_p99_s=0.3)).stage < Stage.DISAGGREGATED


def test_levers_that_already_split_the_pools_are_that_stage() -> None:
    shape = recommend(dataclasses.replace(BASE, disaggregated=True, prefill_gpus=8, decode_gpus=8))
    assert shape.stage == Stage.DISAGGREGATED and "prefill pool of 8 GPUs" in shape.reasons[-1]


def test_the_view_marks_the_path() -> None:
    view = recommend(dataclasses.replace(BASE, request_rate=20.0)).view()
    assert [p["state"] for p in view["path"]] == ["done", "done", "current", "later", "later"]
    assert view["title"] == "Continuous batching + paged attention"


def test_min_tensor_parallel_and_tradeoffs() -> None:
    assert min_tensor_parallel({1: False, 2: False, 4: True, 8: True}) == 4
    assert min_tensor_parallel({1: False, 8: False}) is None
    assert {t[0] for t in TRADEOFFS} >= {"KV cache management", "Prefill/decode split", "Token streaming"}
