"""ServeLab's engine: a readable LLaMA inference engine with paged KV cache and continuous batching.

Imports are lazy so that light processes (the web layer, the load generator) can import
`engine.config` without paying for torch.
"""

from __future__ import annotations

from typing import Any

from engine.platform import machine as _machine

# SERVELAB_CPU_ISA caps torch's kernels too: set before torch reads its environment.
_machine.apply_isa_override()

__all__ = ["LLM", "EngineConfig", "LLMEngine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "LLMEngine":
        from engine.core.llm_engine import LLMEngine

        return LLMEngine
    if name == "SamplingParams":
        from engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "EngineConfig":
        from engine.config import EngineConfig

        return EngineConfig
    raise AttributeError(name)
