"""The forward compiled once per replica with Inductor, as vLLM does on CPU: Llama.forward_varlen
(tensors in, the C++ attention op kept opaque) traced with every size dynamic and its guards
dropped, so Dynamo never traces again; Inductor's C++/OpenMP code fuses RMSNorm, RoPE, SiLU*mul
and the residual adds. Compiled artifacts are cached on disk (.cache/inductor), so a restarted or
rebuilt replica loads them instead of compiling again.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from pathlib import Path

import torch

from engine.kernels import cpu_attention
from engine.model.llama import Llama

log = logging.getLogger("servelab")

CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "inductor"
# vLLM's CPU options: no runtime asserts, epilogue fusion, dead-code elimination, one compile worker.
OPTIONS = {"dce": True, "size_asserts": False, "nan_asserts": False, "epilogue_fusion": True, "compile_threads": 1}


def compile_model(model: Llama, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> float | None:
    """Compiles model.forward_varlen and runs it once (a step that writes nothing), so the first
    request does not pay; returns the seconds that took, or None where it cannot apply."""
    if model.embed.device.type != "cpu" or model.all_reduce is not None or not cpu_attention.available():
        log.info("compile: skipped (needs the C++ CPU op and one rank)")
        return None
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(CACHE_DIR))
    _forget_earlier_model(model)
    model.choose_long_chunks()  # constants of the graph: chosen before tracing
    compiled = torch.compile(
        model.forward_varlen,
        dynamic=True,
        fullgraph=True,
        options={**OPTIONS, "guard_filter_fn": torch.compiler.skip_all_guards_unsafe},
    )
    start = time.perf_counter()
    # Sizes 0 and 1 are not specialised on, so the one graph serves batch 1 as well as batch 64:
    # with its guards dropped, a specialised graph would be reused for shapes it does not fit.
    with torch.fx.experimental._config.patch(backed_size_oblivious=True), torch.inference_mode():
        compiled(*_dummy_step(model), kv_caches)
    model.compiled_forward = compiled
    took = time.perf_counter() - start
    log.info("compile: forward ready in %.1f s (cache %s)", took, os.environ["TORCHINDUCTOR_CACHE_DIR"])
    return took


_compiled_model: weakref.ref[Llama] | None = None


def _forget_earlier_model(model: Llama) -> None:
    """Dynamo keeps one compiled graph per code object, and with the guards dropped it would serve
    an earlier model's graph to this one (another dtype, weights not prepacked: a wrong graph).
    So a process compiles one model at a time: an earlier one still alive runs eager again, and
    the cache is cleared. Replicas are processes of their own; this is for tests and LLM()s."""
    global _compiled_model
    earlier = _compiled_model() if _compiled_model is not None else None
    if earlier is not None and earlier is not model:
        earlier.compiled_forward = None
    torch._dynamo.reset()
    _compiled_model = weakref.ref(model)


def _dummy_step(model: Llama) -> tuple[torch.Tensor, ...]:
    """Two one-token sequences whose K/V go nowhere (slot -1) and that read block 0."""
    i32 = torch.int32
    return (
        torch.zeros(2, dtype=torch.long),
        torch.zeros(2, dtype=torch.long),
        torch.full((2,), -1, dtype=torch.long),
        torch.zeros(2, 1, dtype=i32),
        torch.ones(2, dtype=i32),
        torch.arange(3, dtype=i32),
    )
