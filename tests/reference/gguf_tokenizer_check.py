"""Rebuild the SmolLM2 tokenizer from GGUF metadata alone and compare it with transformers'.

`build_gguf_tokenizer` needs only `gguf` and `tokenizers`: byte-level BPE from
`tokenizer.ggml.tokens` + `tokenizer.ggml.merges`, control tokens (token_type 3) added as
special tokens, a byte-level decoder, no normalizer and no BOS/EOS added on encode.

Pre-tokenizer, two variants (`split_digits`):
  True  -> Sequence([Digits(individual_digits=True), ByteLevel(regex)]): the upstream
           SmolLM2 tokenizer.json and llama.cpp's `tokenizer.ggml.pre = "smollm"`.
  False -> ByteLevel(regex) alone: what transformers 5.x builds from this GGUF (its GGUF
           converter has no "smollm" entry), hence what `hf_greedy.json` was fed.
They differ (in every case checked) only before numerics: a whitespace run of 2+ characters directly
before a digit ("a  1", "\\n\\n1.", " \\n4": split keeps the run whole, "ĠĠ"/"ĊĊ"; without
it the last whitespace character is split off), and a space before a non-ASCII numeric
("½", "Ⅻ", "①"). None of the recorded prompts hits either case.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python tests/reference/gguf_tokenizer_check.py [--gguf PATH]
It compares both variants with transformers' tokenizer on every recorded prompt and on
TOKENIZER_CASES, prints the mismatches and exits non-zero if the matching variant fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONTROL_TOKEN_TYPE = 3

# Strings exercising the tokenizer only (no generation): whitespace runs, digits,
# multi-byte UTF-8, special tokens written in the text, contractions.
TOKENIZER_CASES: tuple[str, ...] = (
    "",
    " ",
    "Hello world",
    " Hello  world ",
    "Don't you'll we've I'm it's THEY'LL",
    "12345 6789 0.5 -3.25e10 1,000,000 $99.99 3rd 2024-03-17",
    "x  =  [1,  22,   333]",
    "\tif x:\n\t\ty = x[0]   +  10\n\n\n#",
    "List:\n\n1. one\n2. two\n\n3. three",
    "a  1 b\t\t2 c\n\n3 d \n4",
    "naïve café résumé Ünïcödé façade jalapeño",
    "日本語のテキスト。中文，한국어, Русский текст, العربية, עברית",
    "Emoji 😀😃🍕☕🇫🇷👨‍👩‍👧 ⭐️ ❤️",
    "x² + y³ = ½ Ⅻ ①",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after end<|endoftext|>",
    "def f(a, b):\n    return a + b  # sum\n",
    "    leading spaces and trailing spaces    ",
    "\r\nWindows\r\nline endings\r\n",
    "~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./",
    "https://example.com/path?query=1&x=2#frag",
)


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise KeyError(f"GGUF has no {key!r}")
    return field.contents()


def build_gguf_tokenizer(path: str | Path, split_digits: bool = True) -> Tokenizer:
    """A `tokenizers.Tokenizer` for a byte-level BPE ("gpt2") GGUF, from its metadata."""
    reader = gguf.GGUFReader(str(path))
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError("only byte-level BPE (tokenizer.ggml.model = gpt2) is supported")
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    token_types: list[int] = list(_field(reader, "tokenizer.ggml.token_type"))
    merges: list[tuple[str, str]] = []
    for merge in _field(reader, "tokenizer.ggml.merges"):
        left, right = merge.split(" ")
        merges.append((left, right))
    vocab = {token: index for index, token in enumerate(tokens)}

    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if split_digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    # Control tokens (<|endoftext|>, <|im_start|>, <|im_end|>, <repo_name>, ...) stay whole.
    tokenizer.add_special_tokens(
        [
            AddedToken(tok, normalized=False, special=True)
            for tok, kind in zip(tokens, token_types)
            if kind == CONTROL_TOKEN_TYPE
        ]
    )
    return tokenizer


def gguf_special_ids(path: str | Path) -> dict[str, int]:
    """bos/eos/unk/pad ids as the GGUF states them."""
    reader = gguf.GGUFReader(str(path))
    out: dict[str, int] = {}
    for name in ("bos", "eos", "unknown", "padding"):
        key = f"tokenizer.ggml.{name}_token_id"
        if key in reader.fields:
            out[name] = int(_field(reader, key))
    return out


def _texts(hf_tokenizer: Any) -> list[tuple[str, str]]:
    from tests.reference.record_hf import prompt_specs

    texts: list[tuple[str, str]] = []
    for spec in prompt_specs():
        if "messages" in spec:
            text = hf_tokenizer.apply_chat_template(spec["messages"], add_generation_prompt=True, tokenize=False)
        else:
            text = spec["text"]
        texts.append((spec["name"], text))
    texts.extend((f"case{i}", text) for i, text in enumerate(TOKENIZER_CASES))
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from engine.model.paths import default_gguf_path

    path = (args.gguf or default_gguf_path()).resolve()
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    print(f"HF pre_tokenizer: {hf.backend_tokenizer.pre_tokenizer}")
    print(f"HF decoder:       {hf.backend_tokenizer.decoder}")
    print(f"GGUF special ids: {gguf_special_ids(path)}")
    print(
        f"HF bos={hf.bos_token!r}/{hf.bos_token_id} eos={hf.eos_token!r}/"
        f"{hf.eos_token_id} adds_bos={hf('a')['input_ids'][:1] == [hf.bos_token_id]}"
    )
    texts = _texts(hf)
    failures = 0
    for split_digits in (False, True):
        ours = build_gguf_tokenizer(path, split_digits=split_digits)
        bad: list[str] = []
        for name, text in texts:
            want = hf(text)["input_ids"]
            got = ours.encode(text).ids
            if got != want:
                bad.append(name)
                print(f"  split_digits={split_digits} {name}: {text[:40]!r}")
                print(f"    hf  : {want[:40]}")
                print(f"    ours: {got[:40]}")
            if ours.decode(got, skip_special_tokens=False) != text:
                bad.append(f"{name}(decode)")
        print(f"split_digits={split_digits}: {len(texts) - len(bad)}/{len(texts)} match")
        if not split_digits:
            failures += len(bad)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
