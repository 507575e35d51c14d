"""Abort, bad input, stops, sampling and timestamps on the real model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import LLM, SamplingParams
from engine.errors import InvalidParamError, ModelLoadError

pytestmark = pytest.mark.integration

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPTS = ["def add(a, b):\n    return", "Once upon a time, in a small village,", "1, 2, 3, 4, 5,"]


def run_all(llm: LLM, started: dict) -> dict[str, list[int]]:
    results: dict[str, list[int]] = {}
    while llm.engine.has_work():
        for out in llm.engine.step():
            if out.finished:
                results[out.request_id] = out.seq.output_token_ids
    return results | started


def test_abort_mid_decode_frees_blocks_and_leaves_others_unchanged(llm_fp32: LLM) -> None:
    baseline = llm_fp32.generate(PROMPTS, GREEDY)
    engine = llm_fp32.engine
    free_before = engine.kv.num_free_blocks
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"abort-{i}", prompt, GREEDY)
    for _ in range(4):
        engine.step()
    victim = engine.requests["abort-1"]
    assert victim.output_token_ids and victim.block_table
    engine.abort("abort-1")
    outs = engine.step()
    assert any(o.request_id == "abort-1" and o.finish_reason == "abort" for o in outs)
    assert victim.block_table == [] and victim.times.aborted is not None
    assert "abort-1" not in [s.request_id for s in engine.scheduler.running]
    finished = run_all(llm_fp32, {})
    assert finished["abort-0"] == baseline[0].token_ids
    assert finished["abort-2"] == baseline[2].token_ids
    assert engine.kv.num_free_blocks == free_before == engine.kv.num_blocks
    assert all(r == 0 for r in engine.kv.ref_counts)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "hi", "params": SamplingParams(max_tokens=9000)}, "max_tokens"),
        ({"prompt_token_ids": [5] * 8192}, "prompt"),
        ({"prompt_token_ids": [10**9]}, "prompt"),
    ],
)
def test_bad_requests_name_the_field_and_the_engine_keeps_serving(llm_fp32: LLM, kwargs: dict, param: str) -> None:
    engine = llm_fp32.engine
    engine.add_request("good", "The sun rises in the", GREEDY)
    with pytest.raises(InvalidParamError) as err:
        engine.add_request("bad", **kwargs)
    assert err.value.param == param and isinstance(err.value, ValueError)
    assert "bad" not in engine.requests
    assert len(run_all(llm_fp32, {})["good"]) == 12


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": "x"}, "seed"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_params(kwargs: dict, param: str) -> None:
    with pytest.raises(InvalidParamError) as err:
        SamplingParams(**kwargs)
    assert err.value.param == param


def test_unknown_model_path() -> None:
    with pytest.raises(ModelLoadError) as err:
        LLM(model="/nonexistent/model.gguf")
    assert err.value.param == "model" and isinstance(err.value, ValueError)


def test_gguf_of_another_architecture(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="gpt2") as err:
        LLM(model=str(path))
    assert err.value.param == "model"


def test_bad_lever() -> None:
    with pytest.raises(InvalidParamError) as err:
        LLM(block_size=0)
    assert err.value.param == "block_size"


def test_stop_string_truncates_and_is_never_streamed(llm_fp32: LLM) -> None:
    full = llm_fp32.generate("def add(a, b):\n    return", GREEDY)[0].text
    stop = full[6:9]
    engine = llm_fp32.engine
    engine.add_request("stop", "def add(a, b):\n    return", SamplingParams(temperature=0, max_tokens=12, stop=[stop]))
    streamed = ""
    while engine.has_work():
        for out in engine.step():
            streamed += out.new_text
            if out.finished:
                assert out.finish_reason == "stop"
    assert streamed == full[: full.index(stop)]


def test_stop_token_ids_and_max_tokens(llm_fp32: LLM) -> None:
    tokens = llm_fp32.generate("Once upon a time", GREEDY)[0].token_ids
    out = llm_fp32.generate(
        "Once upon a time", SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[tokens[3]])
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == tokens[: tokens.index(tokens[3]) + 1]
    out = llm_fp32.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=5))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_eos_stops_unless_ignored(llm_fp32: LLM) -> None:
    chat = [{"role": "user", "content": "Say only the word yes."}]
    out = llm_fp32.chat(chat, SamplingParams(temperature=0, max_tokens=40))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == 2
    out = llm_fp32.chat(chat, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 40


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(llm_fp32: LLM) -> None:
    prompt = "Tell me about the ocean."
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=16)
    a = llm_fp32.generate([prompt, "Other request in the batch"], [seeded, GREEDY])[0].token_ids
    b = llm_fp32.generate(prompt, seeded)[0].token_ids
    assert a == b
    other = llm_fp32.generate(prompt, SamplingParams(temperature=1.0, seed=99, max_tokens=16))[0].token_ids
    assert other != a
    greedy = llm_fp32.generate(prompt, SamplingParams(temperature=0, max_tokens=16))[0].token_ids
    top1 = llm_fp32.generate(prompt, SamplingParams(temperature=0.8, top_k=1, seed=5, max_tokens=16))[0].token_ids
    assert top1 == greedy


def test_streamed_text_is_utf8_safe(llm_fp32: LLM) -> None:
    engine = llm_fp32.engine
    engine.add_request("emoji", "Emoji party: 🎉🎈🥳 and more emoji:", SamplingParams(temperature=0, max_tokens=20))
    pieces = []
    while engine.has_work():
        for out in engine.step():
            pieces.append(out.new_text)
            final = out.seq
    # Only the final piece may carry an incomplete character (cut off by max_tokens).
    assert all("\ufffd" not in p for p in pieces[:-1])
    assert "".join(pieces) == final.output_text == llm_fp32.tokenizer.decode(final.output_token_ids)


def test_timestamps_are_recorded_in_order(llm_fp32: LLM) -> None:
    out = llm_fp32.generate("The three primary colors are", GREEDY)[0]
    t = out.times
    assert t.arrival <= t.queued <= t.scheduled <= t.first_token <= t.finished
    assert len(t.tokens) == len(out.token_ids) and t.tokens == sorted(t.tokens)
    assert t.ttft is not None and t.ttft > 0 and t.tpot is not None and t.e2e >= t.ttft
    assert len(t.itl) == len(out.token_ids) - 1


def test_prefill_first_and_multi_step_change_when_tokens_land_not_which(llm_fp32: LLM) -> None:
    """EngineConfig.prefill_first and scheduler_steps (the 2024 engines' policies) on the live
    engine: the same greedy tokens and streamed text; a multi-step run's tokens land together,
    stamped at its end (the prefill's token, then runs of 4, 4 and the last 3)."""
    baseline = llm_fp32.generate(PROMPTS, GREEDY)
    engine = llm_fp32.engine
    config = engine.config
    engine.config = engine.scheduler.config = config.replace(prefill_first=True, scheduler_steps=4)
    texts, seqs = {}, {}
    try:
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"policy-{i}", prompt, GREEDY)
        while engine.has_work():
            for out in engine.step():
                texts[out.request_id] = texts.get(out.request_id, "") + out.new_text
                if out.finished:
                    seqs[out.request_id] = out.seq
    finally:
        engine.config = engine.scheduler.config = config
    for i, expected in enumerate(baseline):
        seq = seqs[f"policy-{i}"]
        assert seq.output_token_ids == expected.token_ids and texts[seq.request_id] == expected.text
        stamps = seq.times.tokens
        assert stamps[1:5] == [stamps[4]] * 4 and stamps[5:9] == [stamps[8]] * 4 and stamps[0] < stamps[4] < stamps[8]
        assert seq.times.finished == stamps[-1]
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
