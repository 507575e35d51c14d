"""Paged-attention kernels: torch on CPU, Triton on CUDA, chosen per call by the tensors' device
(or `impl=`). triton is imported only when a Triton kernel is asked for."""

from engine.kernels.attention import Impl, paged_attention_decode, pick_impl, prefill_attention, store_kv

__all__ = ["Impl", "paged_attention_decode", "pick_impl", "prefill_attention", "store_kv"]
