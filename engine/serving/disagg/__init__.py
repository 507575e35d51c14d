"""Prefill/decode disaggregation across live replica processes: the decode pool that takes each
prefill replica's handoff (the KV itself moves through engine/core/kv_handoff.py)."""
