"""LlamaConfig: a Llama's shape, and reading it from a GGUF file's metadata or an HF folder's
config.json, free of torch: the KV plan (engine/core/memory.py), the simulator's model specs
(engine/sim/models.py) and a sharded replica's split check read it without loading the model.
engine/model/llama.py and engine/model/loader.py re-export these."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelLoadError
from engine.model.gguf_file import GGUFFile, open_gguf

SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, in bytes per element of 1 (multiply by the dtype's size)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim


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
