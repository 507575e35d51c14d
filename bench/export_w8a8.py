"""The HF export (bench/export_hf.py) as a W8A8 checkpoint in compressed-tensors' int-quantized
format, which vLLM loads for its INT8 W8A8 path (oneDNN on CPU): each decoder linear's weight int8,
symmetric, one scale per output channel (max|row| / 127, as ServeLab's quantization=int8), and
activations quantized per token at run time. The LM head (tied to the embeddings) stays bf16, as
ServeLab's does. This is the scheme llm-compressor writes for "W8A8 dynamic per-token", without
its calibration pass: the same weights ServeLab's engine runs, so the two engines are compared on
the same numbers.

`python -m bench.export_w8a8 [--src .cache/smollm2-hf] [--out .cache/smollm2-w8a8]`
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SCHEME = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
            "output_activations": None,
        }
    },
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
}


def export(src: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    result: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEARS:
            w = tensor.float()
            scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
            result[name] = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
            result[name.removesuffix(".weight") + ".weight_scale"] = scale.to(torch.bfloat16)
        else:
            result[name] = tensor
    save_file(result, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = SCHEME
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for extra in src.iterdir():
        if extra.name not in ("model.safetensors", "config.json", "export_complete.json"):
            shutil.copy(extra, out / extra.name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.export_w8a8", description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / ".cache" / "smollm2-hf")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "smollm2-w8a8")
    args = parser.parse_args(argv)
    print(export(args.src, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
