"""Load LLaMA weights from a GGUF file (dequantized) or an HF safetensors folder.

GGUF stores Q and K rows permuted for llama.cpp's interleaved RoPE; we undo that so one
rotate-half RoPE serves both formats, as transformers does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from engine.errors import ModelLoadError
from engine.model.gguf_file import open_gguf
from engine.model.llama import Llama
from engine.model.llama_config import (  # noqa: F401 - re-exported: the shape alone, torch-free
    SUPPORTED_ARCHITECTURES,
    LlamaConfig,
    _hf_config,
    gguf_config,
    model_config,
)


def load_model(path: str | Path, dtype: torch.dtype, device: str = "cpu") -> Llama:
    path = Path(path)
    if path.is_dir():
        cfg, tensors = _read_hf_folder(path)
    elif path.is_file() and path.suffix == ".gguf":
        cfg, tensors = read_gguf(path)
    else:
        raise ModelLoadError(f"no GGUF file or HF model folder at {str(path)!r}")
    with torch.device("meta"):
        model = Llama(cfg)
    # The compute dtype while still on the meta device: nothing on `device` is ever float32 that
    # runs in bf16 (on an 80 GB card an 8B model would briefly need twice its size).
    model = model.to(dtype).to_empty(device=device)
    _assign(model, tensors, dtype)
    model.init_rope(device)  # buffers made on the meta device hold no values
    model.prepack()
    return model.eval()


def _assign(model: Llama, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    def put(param: torch.nn.Parameter, value: torch.Tensor, name: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise ModelLoadError(f"tensor {name} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
        # Cast where the file's float32 copy is (the host), then move the compute dtype's bytes.
        param.data = value.to(dtype=dtype).contiguous().to(param.device)

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ModelLoadError(f"the model file has no tensor {name}")
        return tensors[name]

    put(model.embed, take("embed"), "embed")
    put(model.norm, take("norm"), "norm")
    if model.cfg.tie_word_embeddings:
        model.lm_head = model.embed
    else:
        put(model.lm_head, take("lm_head"), "lm_head")
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        put(layer.input_norm, take(p + "input_norm"), p + "input_norm")
        put(layer.post_norm, take(p + "post_norm"), p + "post_norm")
        put(layer.qkv, torch.cat([take(p + "q"), take(p + "k"), take(p + "v")]), p + "qkv")
        put(layer.o, take(p + "o"), p + "o")
        put(layer.gate_up, torch.cat([take(p + "gate"), take(p + "up")]), p + "gate_up")
        put(layer.down, take(p + "down"), p + "down")


# GGUF ---------------------------------------------------------------------------------------

_GGUF_NAMES = {
    "attn_norm": "input_norm",
    "ffn_norm": "post_norm",
    "attn_q": "q",
    "attn_k": "k",
    "attn_v": "v",
    "attn_output": "o",
    "ffn_gate": "gate",
    "ffn_up": "up",
    "ffn_down": "down",
}


def read_gguf(path: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """The model's config and its dequantized float32 tensors, Q/K rows in HF's order."""
    import gguf

    file = open_gguf(path)
    cfg = gguf_config(path, file)
    tensors: dict[str, torch.Tensor] = {}
    for t in tqdm(file.tensors, desc=f"loading {path.name}", unit="tensor", file=sys.stderr, leave=False):
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        value = torch.from_numpy(np.array(array, dtype=np.float32))
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            tensors["embed"] = value
        elif t.name == "output_norm.weight":
            tensors["norm"] = value
        elif t.name == "output.weight":
            tensors["lm_head"] = value
        elif parts[0] == "blk" and parts[2] in _GGUF_NAMES:
            name = _GGUF_NAMES[parts[2]]
            if name == "q":
                value = _unpermute(value, cfg.num_heads)
            elif name == "k":
                value = _unpermute(value, cfg.num_kv_heads)
            tensors[f"layers.{parts[1]}.{name}"] = value
    return cfg, tensors


def _unpermute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert_hf_to_gguf permute for Q/K rows."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# HF safetensors folder ------------------------------------------------------------------------

_HF_NAMES = {
    "input_layernorm.weight": "input_norm",
    "post_attention_layernorm.weight": "post_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
}


def _read_hf_folder(path: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    cfg = _hf_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{str(path)!r} has no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for file in tqdm(files, desc=f"loading {path.name}", unit="file", file=sys.stderr, leave=False):
        for name, value in load_file(str(file)).items():
            value = value.float()
            if name == "model.embed_tokens.weight":
                tensors["embed"] = value
            elif name == "model.norm.weight":
                tensors["norm"] = value
            elif name == "lm_head.weight":
                tensors["lm_head"] = value
            elif name.startswith("model.layers."):
                _, _, index, rest = name.split(".", 3)
                if rest in _HF_NAMES:
                    tensors[f"layers.{index}.{_HF_NAMES[rest]}"] = value
    if "lm_head" not in tensors and not cfg.tie_word_embeddings:
        cfg.tie_word_embeddings = True  # some exports drop the tied head
    return cfg, tensors
