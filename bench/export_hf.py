"""Export the default GGUF model to a plain Hugging Face folder, so vLLM and the HF baseline load it.

The GGUF weights are Q4_1; they are dequantized at load and saved as bfloat16 safetensors, the
dtype vLLM runs (rounding the dequantized fp32 values to bf16 costs < 0.4% relative per weight).
Run with the main .venv: `python -m bench.export_hf [--out DIR]`. Skips work when DIR is complete.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from engine.model.paths import default_gguf_path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / ".cache" / "smollm2-hf"
SAVE_DTYPE = torch.bfloat16
# Written last: its presence (with a matching source) is what "complete" means.
MARKER = "export_complete.json"
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def is_complete(out: Path, gguf: Path) -> bool:
    """True when a previous export of this same GGUF file finished in `out`."""
    marker = out / MARKER
    if not marker.is_file() or not all((out / name).is_file() for name in REQUIRED):
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return meta.get("gguf_name") == gguf.name and meta.get("gguf_size") == gguf.stat().st_size


def export(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` and write model, config and tokenizer to `out` (via a temp dir)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        # Plain dense weights: vLLM cannot read transformers' GGUF-block modules.
        quantization_config=GgufConfig(dequantize=True),
        dtype=SAVE_DTYPE,
    )
    # Otherwise config.json says "quantization_method: gguf" and vLLM/transformers look for a
    # .gguf file that the folder does not hold.
    for cfg in (model.config, model.config.get_text_config(decoder=True)):
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
    model.hf_quantizer = None
    model.config.dtype = SAVE_DTYPE
    model.save_pretrained(tmp, safe_serialization=True)
    # Built from the GGUF's own vocab/merges, so ids match what the engine's tokenizer gives.
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(tmp)
    meta = {"gguf_name": gguf.name, "gguf_size": gguf.stat().st_size, "dtype": str(SAVE_DTYPE)}
    (tmp / MARKER).write_text(json.dumps(meta) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a half-written export is never taken as complete


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--gguf", type=Path, default=None, help="default: the shipped SmolLM2")
    parser.add_argument("--force", action="store_true", help="re-export even if complete")
    args = parser.parse_args(argv)
    gguf: Path = args.gguf or default_gguf_path()
    out: Path = args.out.resolve()
    if not args.force and is_complete(out, gguf):
        print(f"[export_hf] {out} is complete; skipping", file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    export(gguf, out)
    print(f"[export_hf] wrote {out} ({SAVE_DTYPE})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
