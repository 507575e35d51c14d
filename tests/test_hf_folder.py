"""An HF safetensors folder (config.json, model.safetensors, tokenizer.json) loads and generates
exactly what the GGUF does. tests/support/hf_folder.py writes the folder from the GGUF's own
dequantized weights, in HF's names and layout, so no download and no transformers are needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from tests.support.hf_folder import write_hf_folder

pytestmark = pytest.mark.integration


def test_hf_folder_matches_gguf(tmp_path: Path, llm_fp32: LLM) -> None:
    write_hf_folder(tmp_path, llm_fp32.tokenizer)
    folder_llm = LLM(model=str(tmp_path), dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=16)
    prompts = ["The days of the week are Monday, Tuesday,", "def square(x):\n    return"]
    want = llm_fp32.generate(prompts, params)
    got = folder_llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    chat = [{"role": "user", "content": "Count from 1 to 5."}]
    assert folder_llm.tokenizer.apply_chat_template(chat) == llm_fp32.tokenizer.apply_chat_template(chat)
    assert folder_llm.engine.eos_token_ids == llm_fp32.engine.eos_token_ids
