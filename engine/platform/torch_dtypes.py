"""EngineConfig.dtype's (and kv_cache_dtype's) names as torch dtypes: rank 0 (llm_engine.py) and the other ranks
(distributed.py) both resolve them here."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn}


def kv_cache_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """EngineConfig.kv_cache_dtype as a torch dtype ("auto": the engine's own, dtype)."""
    return dtype if name == "auto" else KV_CACHE_DTYPES[name]
