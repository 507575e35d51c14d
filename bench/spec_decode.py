"""Speculative decoding on the live engine (issue 43): decode speed with and without n-gram guesses
on text that quotes its prompt (editing a given paragraph), at growing batch sizes, and where it
stops paying. Greedy, so both runs make the same tokens (checked); the runs alternate, plain first.

A request's decode speed is 1 / its TPOT (first token to last over the tokens between); a batch's
is the sum over its requests. Acceptance: guesses the model agreed with over guesses checked.

    python -m bench.spec_decode [--served] [--k 4] [--tokens 128] [--batches 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import sys

from engine import LLM, SamplingParams
from engine.launch.served import SERVED_LEVERS
from engine.llm import GenerationOutput
from engine.serving.load.text_prompts import PARAGRAPHS


def prompts(n: int) -> list[str]:
    return [
        "Fix the spelling in this paragraph and write it out again in full.\n\nParagraph: "
        f"{PARAGRAPHS[i % 4]}\n\nFixed paragraph:"  # the four BENCHMARKS measured
        for i in range(n)
    ]


def decode_tok_s(outputs: list[GenerationOutput]) -> float:
    """Sum over the batch of each request's tokens per second after its first."""
    total = 0.0
    for out in outputs:
        t = out.times.tokens
        if len(t) > 1 and t[-1] > t[0]:
            total += (len(t) - 1) / (t[-1] - t[0])
    return total


def run(llm: LLM, batch: int, tokens: int, k: int) -> tuple[list[GenerationOutput], float, float, float]:
    """(outputs, decode tok/s, acceptance, tokens a verify pass made) with k guesses (0: off)."""
    engine = llm.engine
    engine.reconfigure(num_speculative_tokens=k)
    spec = engine.speculation
    checks, proposed, accepted = spec.checks, spec.proposed, spec.accepted
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    outputs = llm.generate(prompts(batch), params)
    engine.reconfigure(num_speculative_tokens=0)
    checked = spec.checks - checks
    acceptance = (spec.accepted - accepted) / max(1, spec.proposed - proposed)
    per_pass = (spec.accepted - accepted + checked) / max(1, checked)
    return outputs, decode_tok_s(outputs), acceptance, per_pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--served", action="store_true", help="the levers make run serves with (compiled forward)")
    parser.add_argument("--k", type=int, default=4, help="guesses a step (num_speculative_tokens)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    args = parser.parse_args()
    llm = LLM(**(SERVED_LEVERS if args.served else {}))
    engine = llm.engine
    run(llm, 2, 16, args.k)  # warm up both paths
    run(llm, 2, 16, 0)
    print(f"{engine.plan.summary() if engine.plan else ''}; {'served' if args.served else 'eager'}; k = {args.k}")
    print("batch  plain tok/s  spec tok/s  ratio  acceptance  tokens/pass")
    even = None
    for batch in (int(b) for b in args.batches.split(",")):
        plain, plain_s, _, _ = run(llm, batch, args.tokens, 0)
        guessed, spec_s, acceptance, per_pass = run(llm, batch, args.tokens, args.k)
        same = [o.token_ids for o in guessed] == [o.token_ids for o in plain]
        ratio = spec_s / plain_s
        if ratio <= 1.0 and even is None:
            even = batch
        print(
            f"{batch:5d}  {plain_s:11.1f}  {spec_s:10.1f}  {ratio:5.2f}  {acceptance:10.1%}  {per_pass:11.2f}"
            + ("" if same else "  (outputs differ!)")
        )
    print(f"break-even batch: {even if even is not None else 'not reached'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
