"""Write the default model's tokenizer as a Hugging Face tokenizer folder (tokenizer.json and
tokenizer_config.json with the chat template), so tools that count tokens with transformers
(guidellm, `vllm bench serve --tokenizer`) read exactly the ids ServeLab's engine uses, offline.

Rebuilt from the GGUF's own vocab and merges (engine/model/tokenizer.py); no weights, no torch.
`python -m bench.export_tokenizer [--out DIR]` (default .cache/smollm2-tokenizer)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.model.paths import default_gguf_path
from engine.model.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / ".cache" / "smollm2-tokenizer"


def export_tokenizer(out: Path, model: Path | None = None) -> Path:
    tok = load_tokenizer(model or default_gguf_path())
    out.mkdir(parents=True, exist_ok=True)
    tok.tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.eos_token,
        "chat_template": tok.chat_template,
        "model_max_length": 8192,
        "add_bos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    print(f"[export_tokenizer] wrote {export_tokenizer(args.out.resolve())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
