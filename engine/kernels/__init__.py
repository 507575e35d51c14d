"""Paged-attention kernels: the C++ op on CPU (torch where it is not built), Triton on CUDA, chosen
per call by the tensors' device (or `impl=`). triton is imported only when a Triton kernel is asked for."""

from engine.kernels import cpu_attention
from engine.kernels.attention import Impl, paged_attention_decode, pick_impl, prefill_attention, store_kv

__all__ = ["Impl", "cpu_attention", "paged_attention_decode", "pick_impl", "prefill_attention", "store_kv"]
