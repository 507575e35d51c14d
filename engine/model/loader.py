"""Load LLaMA weights from a GGUF file (dequantized) or an HF safetensors folder.

GGUF stores Q and K rows permuted for llama.cpp's interleaved RoPE; we undo that so one
rotate-half RoPE serves both formats, as transformers does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from engine.errors import ModelLoadError
from engine.model.gguf_file import GGUFFile, open_gguf
from engine.model.llama import Llama, LlamaConfig

SUPPORTED_ARCHITECTURES = ("llama",)


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
    model = model.to_empty(device=device)
    _assign(model, tensors, dtype)
    model.init_rope(device)  # buffers made on the meta device hold no values
    model.prepack()
    return model.eval()


def _assign(model: Llama, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    def put(param: torch.nn.Parameter, value: torch.Tensor, name: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise ModelLoadError(f"tensor {name} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
        param.data = value.to(dtype=dtype, device=param.device).contiguous()

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


def gguf_config(path: Path, file: GGUFFile | None = None) -> LlamaConfig:
    """The model's shape from a GGUF file's metadata alone (no tensor is read)."""
    file = file or open_gguf(path)
    meta = file.meta
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{path.name} holds a {arch!r} model; this engine runs {SUPPORTED_ARCHITECTURES}")
    num_heads = int(meta["llama.attention.head_count"])
    hidden = int(meta["llama.embedding_length"])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return LlamaConfig(
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_layers=int(meta["llama.block_count"]),
        num_heads=num_heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", num_heads)),
        head_dim=int(meta.get("llama.attention.key_length", hidden // num_heads)),
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        max_position=int(meta["llama.context_length"]),
        tie_word_embeddings=not any(t.name == "output.weight" for t in file.tensors),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[] if eos is None else [int(eos)],
    )


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


def model_config(path: str | Path) -> LlamaConfig:
    """The model's shape alone (no tensor is read): what a sharded replica checks before it
    spawns its ranks."""
    path = Path(path)
    if path.is_dir():
        return _hf_config(path)
    if path.is_file() and path.suffix == ".gguf":
        return gguf_config(path)
    raise ModelLoadError(f"no GGUF file or HF model folder at {str(path)!r}")


def _hf_config(path: Path) -> LlamaConfig:
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{str(path)!r} has no config.json")
    raw = json.loads(config_file.read_text())
    if raw.get("model_type") not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{path.name} holds a {raw.get('model_type')!r} model; this engine runs {SUPPORTED_ARCHITECTURES}"
        )
    num_heads = raw["num_attention_heads"]
    eos = raw.get("eos_token_id")
    return LlamaConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads", num_heads),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=raw["rms_norm_eps"],
        rope_theta=raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0),
        max_position=raw["max_position_embeddings"],
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=[] if eos is None else (eos if isinstance(eos, list) else [eos]),
    )


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
