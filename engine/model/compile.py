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
from collections.abc import Callable
from pathlib import Path

import torch

from engine.kernels import cpu_attention
from engine.model.int8_linear import Int8Weight
from engine.model.llama import Llama, linear

log = logging.getLogger("servelab")

CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "inductor"
# vLLM's CPU options: no runtime asserts, epilogue fusion, dead-code elimination, one compile worker.
OPTIONS = {"dce": True, "size_asserts": False, "nan_asserts": False, "epilogue_fusion": True, "compile_threads": 1}


def compile_model(
    model: Llama, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], max_tokens: int = 0, max_rows: int = 0
) -> float | None:
    """Compiles model.forward_varlen and runs it once (a step that writes nothing), so the first
    request does not pay; then warms the step shapes (warm_shapes) for max_tokens tokens and up
    to max_rows sampled rows. Returns the seconds compiling took, or None where it cannot apply."""
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
    # The model's floats (the attention scale, RMSNorm's eps) are constants: specialised at once,
    # Dynamo does not trace them symbolically and then restart (that first attempt cost 18 of a
    # warm-cache compile's 27 s here).
    with (
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
        torch._dynamo.config.patch(specialize_float=True),
        torch.inference_mode(),
    ):
        compiled(*_dummy_step(model), kv_caches)
    took = time.perf_counter() - start
    log.info("compile: forward ready in %.1f s (cache %s)", took, os.environ["TORCHINDUCTOR_CACHE_DIR"])
    if max_tokens or max_rows:
        start = time.perf_counter()
        warm_shapes(model, kv_caches, max_tokens, max_rows, compiled)
        log.info("compile: step shapes warmed in %.1f s", time.perf_counter() - start)
    model.compiled_forward = compiled
    return took


@torch.inference_mode()
def warm_shapes(
    model: Llama,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    max_tokens: int,
    max_rows: int,
    forward: Callable[..., torch.Tensor] | None = None,
) -> None:
    """oneDNN builds a kernel for each new row count a prepacked linear meets (about 50 ms for a
    2,048-token step's five shapes here, 5 ms for a decode's), and a step's activations are first
    touched in its first full step: both had landed in the first requests (the engine bench's
    first round ran 10% slower than its second). So a compiled engine runs, before it serves,
    one full-budget step that writes nothing, and the linears at every decode batch size."""
    max_tokens = min(max_tokens, model.cfg.max_position)
    if max_tokens > 1:
        block_size = kv_caches[0][0].shape[1]
        blocks = -(-max_tokens // block_size)
        i32 = torch.int32
        (forward or model.compiled_forward)(  # one sequence of max_tokens over block 0, K/V written nowhere
            torch.zeros(max_tokens, dtype=torch.long),
            torch.arange(max_tokens),
            torch.full((max_tokens,), -1, dtype=torch.long),
            torch.zeros(1, blocks, dtype=i32),
            torch.tensor([max_tokens], dtype=i32),
            torch.tensor([0, max_tokens], dtype=i32),
            kv_caches,
        )
    warm_linears(model, max_rows)


@torch.inference_mode()
def warm_linears(model: Llama, max_rows: int) -> None:
    """The linears (and the logits) at every row count from 1 to max_rows: a decode step's shapes."""
    layer = model.layers[0]
    for rows in range(1, max_rows + 1):
        for name in ("qkv", "o", "gate_up", "down"):
            weight, packed = getattr(layer, name), layer.packed.get(name)
            width = packed.in_features if isinstance(packed, Int8Weight) else weight.shape[1]
            linear(model.embed.new_zeros(rows, width), weight, packed)
        model.raw_logits(model.embed.new_zeros(rows, model.cfg.hidden_size))


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
