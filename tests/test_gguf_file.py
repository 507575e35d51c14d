"""engine/model/gguf_file.py, our own GGUF reader, against gguf-py's GGUFReader on the real model
file: the same metadata and the same tensors, and a clear error for a truncated file."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.errors import ModelLoadError
from engine.model.gguf_file import open_gguf
from engine.model.paths import default_gguf_path

pytestmark = pytest.mark.integration


def test_metadata_and_tensors_equal_gguf_py() -> None:
    path = default_gguf_path()
    ours, theirs = open_gguf(path), gguf.GGUFReader(str(path))
    fields = {key: f.contents() for key, f in theirs.fields.items() if not key.startswith("GGUF.")}
    assert ours.meta == fields  # GGUF.* are gguf-py's own entries for the header, not metadata
    assert len(ours.meta["tokenizer.ggml.tokens"]) == 49_152
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(d) for d in b.shape), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name


def test_a_truncated_file_is_a_model_load_error(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(default_gguf_path().read_bytes()[:100_000])  # inside the vocabulary
    with pytest.raises(ModelLoadError, match="cut.gguf is not a readable GGUF file"):
        open_gguf(cut)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ModelLoadError, match="no GGUF magic"):
        open_gguf(foreign)
