"""The names the levers offer and the simulator knows: its models (with the Llama shapes, from
meta-llama's config.json files) and its devices (engine/sim/constants.py DEVICE_TABLE holds their
figures, and engine/sim/devices.py checks at import that the two name the same devices). At the
bottom floor, free of torch, so that the lever table (engine/levers.py) can read them."""

from __future__ import annotations

# name: (layers, hidden, heads, KV heads, FFN, vocab, context)
LLAMAS = {
    "llama-3.1-8b": (32, 4096, 32, 8, 14336, 128256, 131072),
    "llama-3.1-70b": (80, 8192, 64, 8, 28672, 128256, 131072),
    "llama-3.1-405b": (126, 16384, 128, 8, 53248, 128256, 131072),
    "llama-2-70b": (80, 8192, 64, 8, 28672, 32000, 4096),
}
MODEL_NAMES = ("smollm2-135m", *LLAMAS)  # the first is the one that runs live
DEVICE_NAMES = ("h100", "h200", "a100", "b200", "l4", "mi300x", "cpu")
