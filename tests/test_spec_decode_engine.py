"""Speculative decoding on the real model: greedy output the same token for token, fewer steps where
the text quotes its prompt, stops inside the accepted guesses, seeded sampling, no block left held."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import LLM, SamplingParams
from engine.llm import GenerationOutput

pytestmark = pytest.mark.integration

# Text that quotes its prompt (the n-gram guesses come true) beside text that does not.
QUOTE = (
    "Repeat the text below word for word.\n\nText: The committee approved the new budget on Tuesday, adding "
    "funds for the library, the park and the bus routes downtown.\n\nRepeat: The committee"
)
CODE = "def area(width, height):\n    return width * height\n\n\ndef volume(width, height, depth):\n    return"
PROMPTS = [QUOTE, CODE, "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    yield LLM(dtype="float32")


def generate(llm: LLM, prompts: list[str], params: SamplingParams, k: int) -> tuple[list[GenerationOutput], int]:
    """The outputs with k guesses a step (0: off), and the steps they took."""
    engine = llm.engine
    engine.reconfigure(num_speculative_tokens=k)
    steps = engine.num_steps
    try:
        return llm.generate(prompts, params), engine.num_steps - steps
    finally:
        engine.reconfigure(num_speculative_tokens=0)


def test_greedy_output_is_the_same_token_for_token_in_fewer_steps(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=32)
    plain, plain_steps = generate(llm, PROMPTS, params, 0)
    spec = llm.engine.speculation
    checks, accepted = spec.checks, spec.accepted
    guessed, guessed_steps = generate(llm, PROMPTS, params, 4)
    assert [o.token_ids for o in guessed] == [o.token_ids for o in plain]
    assert spec.checks > checks and spec.accepted > accepted  # guesses were checked, and some stood
    assert guessed_steps < plain_steps
    kv = llm.engine.kv
    assert kv.num_free_blocks == kv.num_blocks  # the guesses' blocks went back with their sequences


def test_quoted_text_alone_takes_far_fewer_steps(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=24)
    plain, plain_steps = generate(llm, [QUOTE], params, 0)
    guessed, guessed_steps = generate(llm, [QUOTE], params, 5)
    assert guessed[0].token_ids == plain[0].token_ids
    assert guessed_steps * 3 <= plain_steps * 2  # at least 1.5 tokens a step


@pytest.mark.parametrize("cut", [3, 7])
def test_a_stop_inside_the_accepted_guesses_ends_the_request_there(llm: LLM, cut: int) -> None:
    """max_tokens and a stop token id that fall inside a step's accepted guesses: the output ends
    where it ends without speculation, nothing after it."""
    free = SamplingParams(temperature=0, max_tokens=24)
    full = generate(llm, [QUOTE], free, 0)[0][0].token_ids
    by_length = SamplingParams(temperature=0, max_tokens=cut)
    by_stop = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[full[cut - 1]])
    for params in (by_length, by_stop):
        plain = generate(llm, [QUOTE], params, 0)[0][0]
        guessed = generate(llm, [QUOTE], params, 5)[0][0]
        assert guessed.token_ids == plain.token_ids and guessed.finish_reason == plain.finish_reason
        assert len(guessed.token_ids) <= cut


def test_seeded_sampling_speculates_and_repeats(llm: LLM) -> None:
    """Sampled requests speculate too (rejection sampling, tests/test_spec_decode.py for the
    distribution); a seed gives the same text twice."""
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=24, ignore_eos=True)
    spec = llm.engine.speculation
    checks = spec.checks
    first = generate(llm, [QUOTE], params, 4)[0][0]
    second = generate(llm, [QUOTE], params, 4)[0][0]
    assert first.token_ids == second.token_ids and len(first.token_ids) == 24
    assert spec.checks > checks


def test_requests_that_need_each_tokens_logits_do_not_speculate(llm: LLM) -> None:
    """Logprobs and penalties need every token's logits alone: such a request decodes as before,
    beside one that speculates."""
    spec = llm.engine.speculation
    penalised = SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.3)
    with_logprobs = SamplingParams(temperature=0, max_tokens=16, logprobs=2)
    for params in (penalised, with_logprobs):
        plain = generate(llm, [QUOTE], params, 0)[0][0]
        checks = spec.checks
        guessed = generate(llm, [QUOTE], params, 4)[0][0]
        assert guessed.token_ids == plain.token_ids
        assert spec.checks == checks


def test_the_labs_quoting_prompts_hand_the_guesses_most_tokens_and_stories_far_fewer(llm: LLM) -> None:
    """prompt_style quote and write (engine/serving/load/text_prompts.py): the share of output
    tokens that were guesses the model kept."""
    import random

    from engine.serving.load.text_prompts import TextPrompts

    engine, rng = llm.engine, random.Random(0)
    assert engine.tokenizer is not None
    texts = TextPrompts(engine.tokenizer.encode)
    quoting = [texts.quote(rng, 120) for _ in range(3)]
    assert all(len(ids) == 120 for ids in quoting)
    stories = [texts.write(rng, 120) for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)

    def guessed_share(prompts: list[list[int]]) -> float:
        accepted = engine.speculation.accepted
        engine.reconfigure(num_speculative_tokens=4)
        try:
            outputs = llm.generate(list(prompts), params)
        finally:
            engine.reconfigure(num_speculative_tokens=0)
        return (engine.speculation.accepted - accepted) / sum(len(o.token_ids) for o in outputs)

    quoted, written = guessed_share(quoting), guessed_share(stories)
    assert quoted > 0.5 and written < quoted - 0.2, (quoted, written)
