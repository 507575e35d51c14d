"""Read a GGUF file's metadata without torch, so light processes (the API front, the tokenizer)
can use it."""

from __future__ import annotations

import logging
from pathlib import Path

from engine.errors import ModelLoadError

log = logging.getLogger("servelab.loader")


def read_gguf_metadata(path: Path) -> dict:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # a truncated or foreign file
        raise ModelLoadError(f"{path.name} is not a readable GGUF file: {exc}") from exc
    meta = {}
    for key, f in reader.fields.items():
        try:
            meta[key] = f.contents()
        except (ValueError, TypeError, IndexError):  # field types this engine never reads
            log.debug("skipping GGUF field %s", key)
    return {"reader": reader, "meta": meta}


def context_length(path: Path) -> int:
    """The model's context window from its metadata (GGUF) or config.json (HF folder)."""
    if path.is_dir():
        import json

        return int(json.loads((path / "config.json").read_text())["max_position_embeddings"])
    meta = read_gguf_metadata(path)["meta"]
    return int(meta[f"{meta['general.architecture']}.context_length"])
