"""Model shapes a what-if run can simulate: the engine's own LlamaConfig plus parameter counts.

Llama shapes are the published config.json values (REFERENCES.md "Model shapes"); SmolLM2-135M
is read from the GGUF metadata of the file the live engine loads, so the two never disagree."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from engine.catalog import LLAMAS, MODEL_NAMES
from engine.model.llama_config import LlamaConfig


@dataclass(frozen=True)
class ModelSpec:
    name: str
    cfg: LlamaConfig

    @property
    def layer_params(self) -> int:
        """Linear weights of one decoder layer: q, k, v, o and gate, up, down (norms are noise)."""
        c = self.cfg
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        return c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size

    @property
    def linear_params(self) -> int:
        return self.cfg.num_layers * self.layer_params

    @property
    def embed_params(self) -> int:
        return self.cfg.vocab_size * self.cfg.hidden_size

    @property
    def head_params(self) -> int:
        """The LM head's weights: read every step even when tied to the embedding."""
        return self.embed_params

    @property
    def num_params(self) -> int:
        tied = self.cfg.tie_word_embeddings
        return self.linear_params + self.embed_params + (0 if tied else self.head_params)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, ctx: int) -> ModelSpec:
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=hidden // heads, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position=ctx, tie_word_embeddings=False,
    )
    return ModelSpec(name, cfg)




@cache
def smollm2() -> ModelSpec:
    from engine.model.llama_config import gguf_config
    from engine.model.paths import default_gguf_path

    return ModelSpec("smollm2-135m", gguf_config(default_gguf_path()))


def get_model(name: str) -> ModelSpec:
    """The model by name, case-insensitive; KeyError names the known ones."""
    key = name.lower()
    if key == "smollm2-135m":
        return smollm2()
    if key in LLAMAS:
        return _llama(key, *LLAMAS[key])
    raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}")
