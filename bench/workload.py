"""The engine benchmark's workload, shared by ServeLab and its peers so all run the same requests.

64 requests, prompt lengths uniform in [50, 400] tokens, 128 output tokens each, ignore_eos.
Prompts are token ids drawn from ordinary (non-special) vocabulary so every system sees the
same ids without a tokenizer round trip.
"""

from __future__ import annotations

import json
import random
import sys

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


if __name__ == "__main__":
    json.dump(make_workload(), sys.stdout)
