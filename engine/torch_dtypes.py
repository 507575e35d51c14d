"""EngineConfig.dtype's names as torch dtypes: rank 0 (llm_engine.py) and the other ranks
(distributed.py) both resolve them here."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
