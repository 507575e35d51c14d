"""Prefill/decode disaggregation's handoff on the real model: one engine prefills and copies its
prompt's KV blocks out, they cross a shared-memory segment, another engine files them as cached
prefix blocks and decodes from there, token for token as one engine alone would; and the bytes
are what it decodes from (zeros in their place change the text)."""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.kv_handoff import caches_of, import_prompt, read_shared, write_shared
from engine.core.llm_engine import LLMEngine
from engine.core.sequence import Sequence

pytestmark = pytest.mark.integration

PROMPT = (
    "Fix the spelling in this text and write it out again in full.\n\nText: The city council met on Tuesday "
    "evening to discuss the new bus routes. Residents asked for more stops near the hospital and the school, "
    "and the council agreed to study the costs before the next meeting in March.\n\nFixed text:"
)
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def new_engine(kv_budget_mb: float = 32) -> LLMEngine:
    return LLM(dtype="float32", kv_budget_mb=kv_budget_mb).engine


@pytest.fixture(scope="module")
def prefill() -> Iterator[LLMEngine]:
    yield new_engine()


def run(engine: LLMEngine, seq: Sequence) -> None:
    while not seq.is_finished:
        engine.step()


def prefill_and_export(engine: LLMEngine, ids: list[int], request_id: str) -> Sequence:
    seq = engine.add_request(request_id, params=SamplingParams(temperature=0, max_tokens=1), prompt_token_ids=ids)
    seq.export_kv = True
    run(engine, seq)
    return seq


def test_a_handed_off_prompt_decodes_as_it_would_have_where_it_was_prefilled(prefill: LLMEngine) -> None:
    assert prefill.tokenizer is not None
    ids = prefill.tokenizer.encode(PROMPT)
    bs = prefill.config.block_size
    alone = prefill.add_request("alone", params=GREEDY, prompt_token_ids=ids)
    run(prefill, alone)

    handed = prefill_and_export(prefill, ids, "prefilled")
    first, blocks = handed.output_token_ids[0], handed.exported_kv
    assert first == alone.output_token_ids[0]
    assert blocks.shape[:3] == (prefill.model_cfg.num_layers, 2, len(ids) // bs)
    shared = write_shared(blocks)
    assert shared.nbytes == blocks.numel() * blocks.element_size()
    received = read_shared(shared)
    assert torch.equal(received, blocks)
    with pytest.raises(FileNotFoundError):  # read once, unlinked
        shared_memory.SharedMemory(name=shared.name)

    decode = new_engine()
    assert import_prompt(decode.kv, caches_of(decode.runner), ids, received) == len(ids) // bs
    rest = SamplingParams(temperature=0, max_tokens=GREEDY.max_tokens - 1, ignore_eos=True)
    seq = decode.add_request("decoded", params=rest, prompt_token_ids=[*ids, first])
    run(decode, seq)
    assert seq.num_cached_tokens == (len(ids) // bs) * bs  # it started past the handed-off blocks
    assert [first, *seq.output_token_ids] == alone.output_token_ids
    assert decode.kv.num_used_blocks == 0  # the handed-off blocks are cached, free to evict

    # The bytes are what it decodes from: zeros in their place change the answer.
    blank = new_engine()
    import_prompt(blank.kv, caches_of(blank.runner), ids, torch.zeros_like(received))
    wrong = blank.add_request("blank", params=rest, prompt_token_ids=[*ids, first])
    run(blank, wrong)
    assert wrong.output_token_ids != seq.output_token_ids


def test_a_decode_side_short_of_blocks_takes_what_fits_and_computes_the_rest(prefill: LLMEngine) -> None:
    assert prefill.tokenizer is not None
    ids = prefill.tokenizer.encode(PROMPT)
    bs = prefill.config.block_size
    handed = prefill_and_export(prefill, ids, "prefilled-again")
    decode = new_engine(kv_budget_mb=8)  # about ten blocks
    # Another request holds all but three of them while the handoff lands.
    held = [500 + i for i in range(bs * (decode.kv.num_blocks - 3))]
    hog = decode.add_request("hog", params=SamplingParams(temperature=0, max_tokens=2), prompt_token_ids=held)
    decode.step()
    assert not hog.is_finished and decode.kv.num_free_blocks == 3
    assert len(ids) // bs > 3
    assert import_prompt(decode.kv, caches_of(decode.runner), ids, handed.exported_kv) == 3  # the first three: a chain from the start
    decode.abort("hog")  # it leaves without taking a block (a decode that did could evict them: cached, free)
    decode.step()
    assert hog.is_finished
    seq = decode.add_request("decoded", params=SamplingParams(temperature=0, max_tokens=8), prompt_token_ids=ids)
    run(decode, seq)
    assert seq.num_cached_tokens == 3 * bs


def test_a_segment_discarded_unread_is_gone() -> None:
    shared = write_shared(torch.arange(24, dtype=torch.bfloat16).reshape(1, 2, 3, 4))
    assert shared.nbytes == 48 and shared.num_blocks == 3
    shared.discard()
    shared.discard()  # twice is harmless
    with pytest.raises(FileNotFoundError):
        read_shared(shared)
