"""Deterministic model weights, generated on the machine from a seed and written as an HF folder
(config.json, model.safetensors, a stand-in tokenizer.json): the 94 MB GGUF does not travel to
a lent GPU machine, and nothing may be downloaded there.

Every tensor is drawn on the CPU from its own torch.Generator, seeded by the run's seed and the
tensor's name, so the CPU and the GPU load the same values, and a dry run with fewer layers
draws the same values for the tensors it shares with the full model (embed_sha256 says so).
Stored in bfloat16, so bf16, fp16 and fp32 engines all start from exactly the same numbers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SEED = 44  # the number; any fixed value works
OUT_GAIN = 2.0
COMPLETE = "complete.json"  # written last: its presence is what "the folder is whole" means


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    rope_theta: float
    max_position: int
    rms_norm_eps: float = 1e-5
    note: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# SmolLM2-135M-Instruct's shape, as its GGUF's metadata gives it (engine/model/llama_config.py
# gguf_config on the shipped file: 49152 vocab, 576 hidden, 1536 intermediate, 30 layers, 9 heads,
# 3 KV heads, head_dim 64, eps 1e-5, rope theta 100000, context 8192, tied embeddings).
SMOLLM2 = ModelShape("smollm2-135m", 576, 30, 9, 3, 1536, 49152, True, 100000.0, 8192)
# One layer of Llama-3.1-8B (4096 hidden, 32 heads, 8 KV heads, 14336 intermediate, 128256 vocab,
# untied head): its weights and KV are what a memory plan and a roofline need. Plain RoPE, and a
# context of 8192 rather than 131072: the engine has no llama3 RoPE scaling, and its table of
# cos/sin per position would be 16x larger for nothing this check measures.
LLAMA8B_LAYER = ModelShape("llama-3.1-8b-1-layer", 4096, 1, 32, 8, 14336, 128256, False, 500000.0, 8192)


def dry_run_shape(shape: ModelShape) -> ModelShape:
    """The dry run's cut of a shape, quick on a 2-core CPU; note says what was cut and why."""
    if shape.name == SMOLLM2.name:
        return dataclasses.replace(
            shape, layers=2, note="2 of 30 layers: a 2-core CPU under the Triton interpreter runs 30 in minutes"
        )
    return dataclasses.replace(
        shape,
        name=shape.name + "-reduced",
        hidden=1024,
        heads=8,
        kv_heads=2,
        intermediate=1536,
        vocab=4096,
        note="hidden 1024, 8/2 heads (head_dim 128 and GQA group 4 kept), intermediate 1536, vocab 4096: "
        "the 8B layer's 1.3 B parameters take minutes to draw and load on a 2-core CPU",
    )


def tensor_specs(shape: ModelShape) -> dict[str, tuple[tuple[int, int] | tuple[int], float]]:
    """HF name -> (shape, std); std 0 means ones (the RMSNorm weights). The init keeps logits and
    attention away from uniform, so a wrong kernel shows in the tokens: the embedding's std is
    2.5 / sqrt(hidden), giving (tied) logits of std ~2.5 and clear top-1/top-2 gaps; q and k of
    1.2 / sqrt(hidden) give attention scores of std ~1.4 (peaked, but not one-hot); the rest
    0.5 / sqrt(fan_in) keeps every layer's update a fraction of the residual stream."""
    h, d = shape.hidden, shape.head_dim
    q, kv, inter = shape.heads * d, shape.kv_heads * d, shape.intermediate
    specs: dict[str, tuple[Any, float]] = {"model.embed_tokens.weight": ((shape.vocab, h), 2.5 / h**0.5)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        specs |= {
            p + "input_layernorm.weight": ((h,), 0.0),
            p + "self_attn.q_proj.weight": ((q, h), 1.2 / h**0.5),
            p + "self_attn.k_proj.weight": ((kv, h), 1.2 / h**0.5),
            p + "self_attn.v_proj.weight": ((kv, h), 0.5 / h**0.5),
            p + "self_attn.o_proj.weight": ((h, q), OUT_GAIN / q**0.5),
            p + "post_attention_layernorm.weight": ((h,), 0.0),
            p + "mlp.gate_proj.weight": ((inter, h), 0.5 / h**0.5),
            p + "mlp.up_proj.weight": ((inter, h), 0.5 / h**0.5),
            p + "mlp.down_proj.weight": ((h, inter), OUT_GAIN / inter**0.5),
        }
    specs["model.norm.weight"] = ((h,), 0.0)
    if not shape.tied:
        specs["lm_head.weight"] = ((shape.vocab, h), 2.5 / h**0.5)
    return specs


def draw(name: str, size: tuple[int, ...], std: float, seed: int = SEED) -> torch.Tensor:
    """One tensor in bfloat16, from a CPU generator seeded by (seed, name): the same on any machine."""
    if std == 0.0:
        return torch.ones(size, dtype=torch.bfloat16)
    gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.empty(size, dtype=torch.float32).normal_(0.0, std, generator=gen).to(torch.bfloat16)


def hf_config(shape: ModelShape) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": shape.rms_norm_eps,
        # Both spellings: transformers 4.x reads rope_theta, 5.x rope_parameters; the engine either.
        "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "max_position_embeddings": shape.max_position,
        "tie_word_embeddings": shape.tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A stand-in tokenizer.json (token i is the word "<i>"): the engine's loader requires one in an
    HF folder (engine/worker/live_executor.py loads it unconditionally), and the prompts here are token
    ids, so only decoding the outputs to text ever uses it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))


def write_folder(shape: ModelShape, folder: Path, seed: int = SEED) -> dict[str, Any]:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    tensors = {name: draw(name, size, std, seed) for name, (size, std) in tensor_specs(shape).items()}
    embed_sha = hashlib.sha256(tensors["model.embed_tokens.weight"].view(torch.int16).numpy().tobytes()).hexdigest()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf_config(shape), indent=1))
    write_tokenizer(folder, shape.vocab)
    params = sum(t.numel() for t in tensors.values())
    info = {"shape": dataclasses.asdict(shape), "seed": seed, "params": params, "embed_sha256": embed_sha}
    (folder / COMPLETE).write_text(json.dumps(info, indent=1))
    return info


def ensure_model(shape: ModelShape, tmp: Path, seed: int = SEED) -> tuple[Path, dict[str, Any]]:
    """The folder for shape under tmp, written once and shared by the phases (each its own process):
    written beside it and renamed into place, so a phase killed mid-write leaves no half folder."""
    folder = tmp / f"{shape.name}-seed{seed}"
    if not (folder / COMPLETE).exists():
        partial = tmp / f".{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        write_folder(shape, partial, seed)
        try:
            os.rename(partial, folder)
        except OSError:  # another phase finished it first: theirs is the same values
            shutil.rmtree(partial, ignore_errors=True)
    return folder, json.loads((folder / COMPLETE).read_text())
