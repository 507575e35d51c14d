"""The engine benchmark's workload, shared by ServeLab and its peers so all run the same requests.

64 requests, prompt lengths uniform in [50, 400] tokens, 128 output tokens each, ignore_eos.
Prompts are token ids drawn from ordinary (non-special) vocabulary so every system sees the
same ids without a tokenizer round trip.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections.abc import Callable

NUM_REQUESTS = 64
PROMPT_LEN_RANGE = (50, 400)
OUTPUT_TOKENS = 128
SEED = 0
# SmolLM2's first 17 ids are special tokens; stay well clear of them.
TOKEN_ID_RANGE = (100, 49000)


def make_workload(num_requests: int = NUM_REQUESTS, output_tokens: int = OUTPUT_TOKENS, seed: int = SEED) -> list[dict]:
    """A list of {"prompt_token_ids": [...], "max_tokens": n}, the same for a given seed."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        length = rng.randint(*PROMPT_LEN_RANGE)
        ids = [rng.randint(*TOKEN_ID_RANGE) for _ in range(length)]
        requests.append({"prompt_token_ids": ids, "max_tokens": output_tokens})
    return requests


# One stream: TTFT of a long prompt, and decode speed at batch 1 after a medium one.
LONG_PROMPT_TOKENS = 2000
DECODE_PROMPT_TOKENS = 500
DECODE_TOKENS = 128
ONE_STREAM_REPEATS = 3


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(*TOKEN_ID_RANGE) for _ in range(length)]


def time_one_stream(generate: Callable[[list[int], int], None]) -> dict:
    """generate(prompt_token_ids, max_tokens) runs one request to its end (greedy, ignore_eos).
    Each repeat gets a fresh prompt, so a prefix cache never answers from an earlier one. Decode
    speed is DECODE_TOKENS over the difference between a (DECODE_TOKENS + 1)-token and a 1-token
    generation of same-length prompts: the prefill cancels out. Medians of the repeats."""

    def timed(prompt: list[int], max_tokens: int) -> float:
        start = time.perf_counter()
        generate(prompt, max_tokens)
        return time.perf_counter() - start

    ttft, decode = [], []
    for r in range(ONE_STREAM_REPEATS):
        ttft.append(timed(_prompt(LONG_PROMPT_TOKENS, 1000 + r), 1))
        first = timed(_prompt(DECODE_PROMPT_TOKENS, 2000 + r), 1)
        whole = timed(_prompt(DECODE_PROMPT_TOKENS, 3000 + r), DECODE_TOKENS + 1)
        decode.append(DECODE_TOKENS / max(whole - first, 1e-9))
    return {
        "ttft_2000_s": round(statistics.median(ttft), 4),
        "decode_batch1_tok_s": round(statistics.median(decode), 1),
    }


if __name__ == "__main__":
    json.dump(make_workload(), sys.stdout)
