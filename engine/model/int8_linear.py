"""W8A8 int8 linears (EngineConfig.quantization "int8"): each weight quantized once per output
channel (symmetric, scale = max|row| / qmax), each activation row quantized per token on the fly
(scale = max|x| / 127), the product summed in int32 and scaled back. This is vLLM's W8A8 scheme
(compressed-tensors' "int8 dynamic per-token"); the LM head and the embeddings stay in the
engine's dtype (a logit's error reaches the pick directly).

The integer GEMM, by device:
- x86-64 CPU: oneDNN's u8 x s8 kernels (onednn::qlinear_pointwise) on a prepacked weight, through
  the C++ op's servelab::linear_int8 (quantizes the rows, one call, no Python between) or, where
  the op is not built, the same oneDNN op from Python. oneDNN runs it on AMX-INT8, AVX-512 VNNI
  or AVX-VNNI; on a CPU with none of them (AVX2: vpmaddubsw adds two u8 x s8 products into int16
  with saturation) the weights keep 7 bits, so no pair of products can reach 2^15 (torch._int_mm
  on such a CPU goes through oneDNN as well).
- CUDA, and CPUs oneDNN does not serve: torch._int_mm (cuBLASLt's int8 GEMM on CUDA).

Integer sums are exact, so a row's result does not depend on the rows beside it: int8 linears are
batch-invariant by construction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.platform import machine

QUANTIZATIONS = ("none", "int8")
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) under which it has no VNNI instruction.
_NO_VNNI_CAPS = ("SSE41", "AVX", "AVX2", "AVX512_CORE")


@dataclass(frozen=True)
class Int8Weight:
    packed: torch.Tensor  # "onednn": qlinear_prepack's blocked int8; "int_mm": int8 [K, N]
    scale: torch.Tensor  # [N] float32, per output channel
    zero_point: torch.Tensor  # [N] int64 zeros (symmetric; oneDNN's op asks for them)
    in_features: int
    out_features: int
    path: str  # "onednn" or "int_mm"

    @property
    def nbytes(self) -> int:
        return self.in_features * self.out_features + self.scale.numel() * 4


def int8_path(device: str) -> str:
    """Which integer GEMM the linears take on this device."""
    if device == "cpu" and machine.cpu().arch == "x86_64" and torch.backends.mkldnn.is_available():
        return "onednn"
    return "int_mm"


def describe(device: str) -> str:
    """The int8 GEMM the linears take here, as the executor's plan names it: "int8 onednn-vnni",
    "int8 onednn-7bit" (no int8 dot products: 7-bit weights) or "int8 int_mm"."""
    if int8_path(device) != "onednn":
        return "int8 int_mm"
    return "int8 onednn-vnni" if has_int8_dot() else "int8 onednn-7bit"


def has_int8_dot() -> bool:
    """Whether oneDNN multiplies int8 here with VNNI (AVX-512 VNNI, AVX-VNNI) or AMX-INT8, which
    sum in int32; without, it saturates in int16 (7-bit weights keep clear of it)."""
    info = machine.cpu()
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in _NO_VNNI_CAPS:
        return False
    return info.arch == "x86_64" and any(info.has(f) for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def weight_qmax(device: str) -> int:
    """127, or 63 on an x86 CPU without int8 dot products: there oneDNN (also behind torch._int_mm
    on CPU) adds u8 x s8 pairs in saturating int16."""
    if device != "cpu" or machine.cpu().arch != "x86_64" or has_int8_dot():
        return 127
    return 63


def quantize_weight(weight: torch.Tensor, path: str) -> Int8Weight:
    """weight [N, K] (any float dtype) -> int8 per output channel."""
    w = weight.detach().float()
    qmax = weight_qmax(w.device.type)
    scale = (w.abs().amax(dim=1) / qmax).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-qmax, qmax).to(torch.int8)
    n, k = q.shape
    zero = torch.zeros(n, dtype=torch.long, device=q.device)
    if path == "onednn":
        packed = torch.ops.onednn.qlinear_prepack(q, None)
    else:
        packed = q.t()  # [K, N], column-major: what _int_mm (cuBLASLt on CUDA) takes
    return Int8Weight(packed, scale, zero, k, n, path)


def int8_linear(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x [M, K] @ W.T -> [M, N] in x's dtype, x quantized per row."""
    if w.path == "onednn":
        from engine.kernels import cpu_attention

        if torch.compiler.is_compiling() or cpu_attention.available():  # compiled: the op is loaded
            return torch.ops.servelab.linear_int8(x, w.packed, w.scale, w.zero_point, w.out_features)
        xq, row_scale = _quantize_rows(x)
        y = torch.ops.onednn.qlinear_pointwise(
            (xq.to(torch.int16) + 128).to(torch.uint8), 1.0, 128, w.packed, w.scale, w.zero_point,
            None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        return (y * row_scale).to(x.dtype)
    xq, row_scale = _quantize_rows(x)
    rows = xq.shape[0]
    if xq.is_cuda:  # cuBLASLt's int8 GEMM takes more than 16 rows, a multiple of 8
        xq = torch.nn.functional.pad(xq, (0, 0, 0, max(17, rows) + (-max(17, rows)) % 8 - rows))
    y = torch._int_mm(xq, w.packed)[:rows].float()
    return (y * row_scale * w.scale).to(x.dtype)


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 rows and their scales [M, 1] (max|row| / 127; 1 for a row of zeros)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(xf / scale).clamp(-127, 127).to(torch.int8), scale


def quantize_model(model: torch.nn.Module, quantization: str, device: str) -> bool:
    """Every decoder layer's linears to int8 in place ("none": nothing). The float weights are
    freed: a layer keeps an empty parameter and its Int8Weight in layer.packed. Returns whether
    it quantized."""
    if quantization == "none":
        return False
    path = int8_path(device)
    for layer in model.layers:  # type: ignore[attr-defined]
        for name in ("qkv", "o", "gate_up", "down"):
            weight = getattr(layer, name)
            layer.packed[name] = quantize_weight(weight, path)
            setattr(layer, name, torch.nn.Parameter(weight.new_empty(0), requires_grad=False))
    return True
