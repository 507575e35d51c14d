"""An HF safetensors folder written from the GGUF's own dequantized weights, in HF's names and
layout (config.json, model.safetensors, tokenizer.json): no download, no transformers."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from engine.model.loader import read_gguf
from engine.model.paths import default_gguf_path
from engine.model.tokenizer import ChatTokenizer


def write_hf_folder(folder: Path, tokenizer: ChatTokenizer) -> None:
    cfg, tensors = read_gguf(default_gguf_path())
    names = {
        "input_norm": "input_layernorm.weight",
        "post_norm": "post_attention_layernorm.weight",
        "q": "self_attn.q_proj.weight",
        "k": "self_attn.k_proj.weight",
        "v": "self_attn.v_proj.weight",
        "o": "self_attn.o_proj.weight",
        "gate": "mlp.gate_proj.weight",
        "up": "mlp.up_proj.weight",
        "down": "mlp.down_proj.weight",
    }
    hf = {"model.embed_tokens.weight": tensors["embed"], "model.norm.weight": tensors["norm"]}
    for key, value in tensors.items():
        if key.startswith("layers."):
            _, index, name = key.split(".")
            hf[f"model.layers.{index}.{names[name]}"] = value
    save_file({k: v.contiguous() for k, v in hf.items()}, str(folder / "model.safetensors"))
    config = {
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position,
        "tie_word_embeddings": True,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_ids[0],
    }
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer.tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": tokenizer.chat_template, "eos_token": tokenizer.eos_token})
    )
