"""Engine outputs against a reference: HF transformers' LlamaForCausalLM over the same weights in
float32 (teacher-forced along the engine's own tokens), or another engine.

Greedy tokens are compared only where the reference's top-1 logit beats its top-2 by a clear
margin: where two tokens are closer than the compared engine's rounding (bf16 logits move by a few
hundredths), either is a correct greedy answer, and a flip there is not a bug. Logprobs are
compared everywhere, within a tolerance for the engine's dtype. Teacher forcing along the
engine's path means one flip does not turn every later position into a mismatch."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Per engine dtype: (top-1 minus top-2 logit margin below which greedy tokens are not compared,
# largest |logprob - reference logprob| allowed). fp32 differs from HF's fp32 by summation order
# only; bf16's weights are exact (stored in bf16) but its activations round to 8 bits at every
# layer: on a CPU, 30 layers of bf16 were at most 0.08 from HF's fp32 logprobs, and its greedy flips
# came at margins of 0.003 and 0.03. About 4x that here; the phases record the maxima they saw.
TOLERANCES = {"float32": (0.02, 0.02), "bfloat16": (0.25, 0.3), "float16": (0.1, 0.1)}


@dataclass
class Generated:
    """One request's greedy output: its tokens, their logprobs, and the engine's top-2 margin."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    margins: list[float] = field(default_factory=list)  # top-1 minus top-2 logprob, where asked
    prompt_logprobs: list[float] = field(default_factory=list)  # positions 1..P-1, where asked


@dataclass
class Reference:
    """The reference's view of positions P..P+G-1 of prompt + tokens."""

    argmax: list[int]
    margin: list[float]  # top-1 minus top-2 logit
    logprob: list[float]  # of the compared sequence's token at each position


def from_outputs(outputs: list[Any]) -> list[Generated]:
    """engine.llm.GenerationOutput with logprobs asked (logprobs >= 1 also gives the margins)."""
    runs = []
    for o in outputs:
        lps = o.logprobs or []
        margins = [t.top[0][1] - t.top[1][1] for t in lps if len(t.top) >= 2]
        prompt_lps = [t.logprob for t in (o.prompt_logprobs or []) if t is not None]
        runs.append(
            Generated(list(o.prompt_token_ids), list(o.token_ids), [t.logprob for t in lps], margins, prompt_lps)
        )
    return runs


class HFReference:
    """transformers' LlamaForCausalLM in float32 over an HF folder, built from config.json and the
    safetensors directly (no from_pretrained: nothing is looked up, on any transformers version)."""

    def __init__(self, folder: Path, device: str) -> None:
        from safetensors.torch import load_file
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig.from_pretrained(str(folder), attn_implementation="eager")
        self.model = LlamaForCausalLM(config)
        state = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise RuntimeError(f"HF model: missing {missing}, unexpected {unexpected}")
        if config.tie_word_embeddings:
            self.model.tie_weights()
            assert self.model.lm_head.weight.data_ptr() == self.model.model.embed_tokens.weight.data_ptr()
        self.model = self.model.float().to(device).eval()
        self.device = device
        self._cache: dict[tuple[int, ...], Reference] = {}

    @torch.inference_mode()
    def along(self, run: Generated) -> Reference:
        key = (len(run.prompt), *run.prompt, *run.tokens)
        if key not in self._cache:
            ids = torch.tensor([run.prompt + run.tokens[:-1]], device=self.device)
            logits = self.model(ids).logits[0, len(run.prompt) - 1 :].float()
            top = logits.topk(2, dim=-1).values
            logprobs = logits.log_softmax(-1)
            chosen = logprobs.gather(1, torch.tensor(run.tokens, device=self.device)[:, None])[:, 0]
            self._cache[key] = Reference(logits.argmax(-1).tolist(), (top[:, 0] - top[:, 1]).tolist(), chosen.tolist())
        return self._cache[key]

    @torch.inference_mode()
    def prompt_logprobs(self, prompt: list[int]) -> list[float]:
        """Each prompt token's logprob given the ones before it (positions 1..P-1)."""
        logits = self.model(torch.tensor([prompt], device=self.device)).logits[0, :-1].float()
        targets = torch.tensor(prompt[1:], device=self.device)[:, None]
        return logits.log_softmax(-1).gather(1, targets)[:, 0].tolist()

    def close(self) -> None:
        del self.model
        free_memory()


def against_reference(run: Generated, ref: Reference, margin_min: float, lp_tol: float) -> dict[str, Any]:
    """The engine's tokens and logprobs at each position against the reference's along that path."""
    mismatches, near_ties, worst = [], 0, 0.0
    for i, token in enumerate(run.tokens):
        if ref.margin[i] < margin_min:
            near_ties += 1
        elif token != ref.argmax[i]:
            mismatches.append(
                {"pos": i, "engine": token, "reference": ref.argmax[i], "margin": round(ref.margin[i], 4)}
            )
        if i < len(run.logprobs):
            worst = max(worst, abs(run.logprobs[i] - ref.logprob[i]))
    compared = len(run.tokens) - near_ties
    ok = not mismatches and worst <= lp_tol and len(run.logprobs) == len(run.tokens)
    return {"ok": ok, "compared": compared, "near_ties": near_ties, "mismatches": mismatches[:5],
            "max_logprob_err": round(worst, 6)}  # fmt: skip


def between_runs(a: Generated, b: Generated, ref_a: Reference, margin_min: float, lp_tol: float) -> dict[str, Any]:
    """Two engines' greedy paths: equal up to the first divergence, which is allowed only where
    the reference's margin (along a's path, which b shares up to there) says it is a near tie;
    logprobs within lp_tol over the shared positions."""
    shared = 0
    while shared < min(len(a.tokens), len(b.tokens)) and a.tokens[shared] == b.tokens[shared]:
        shared += 1
    diverged = shared < max(len(a.tokens), len(b.tokens))
    explained = not diverged or (shared < len(ref_a.margin) and ref_a.margin[shared] < margin_min)
    pairs = list(zip(a.logprobs[:shared], b.logprobs[:shared]))
    worst = max((abs(x - y) for x, y in pairs), default=0.0)
    return {
        "ok": explained and worst <= lp_tol,
        "shared_tokens": shared,
        "of": len(a.tokens),
        "diverged_at": shared if diverged else None,
        "margin_there": round(ref_a.margin[shared], 4) if diverged and shared < len(ref_a.margin) else None,
        "max_logprob_diff": round(worst, 6),
    }


def between_engines(a: Generated, b: Generated, margin_min: float, lp_tol: float) -> dict[str, Any]:
    """between_runs with a's own top-2 margins (logprobs >= 2) as the reference: no HF needed."""
    ref = Reference(a.tokens, a.margins, a.logprobs)
    return between_runs(a, b, ref, margin_min, lp_tol)


def prompt_against_reference(run: Generated, ref: list[float], lp_tol: float) -> dict[str, Any]:
    """The engine's prompt logprobs (its prefill, over random ids) against the reference's."""
    worst = max((abs(a - b) for a, b in zip(run.prompt_logprobs, ref)), default=float("inf"))
    ok = len(run.prompt_logprobs) == len(ref) and worst <= lp_tol
    return {"ok": ok, "positions": len(ref), "max_logprob_err": round(worst, 6)}


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several requests' comparisons as one check's detail."""
    keys = ("max_logprob_err", "max_logprob_diff")
    worst = max((r[k] for r in results for k in keys if k in r), default=0.0)
    return {
        "requests": len(results),
        "failed": [i for i, r in enumerate(results) if not r["ok"]],
        "worst_logprob_diff": worst,
        "compared_tokens": sum(r.get("compared", r.get("shared_tokens", 0)) for r in results),
        "near_ties": sum(r.get("near_ties", 0) for r in results),
        "per_request": results,
    }


def free_memory() -> None:
    """Between engines in one phase: drop what the last one held before the next one plans."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
