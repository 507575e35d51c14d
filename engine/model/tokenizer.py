"""Tokenizer and chat template, rebuilt from GGUF metadata or read from an HF folder.

SmolLM2's GGUF tokenizer is byte-level BPE with every digit split on its own (llama.cpp's
"smollm" pre-tokenizer); `tokenizers` rebuilds it exactly from the vocab and merges.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from engine.errors import ModelLoadError

GGUF_CONTROL_TOKEN = 3  # llama.cpp token_type for special/control tokens


class ChatTokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        eos_token_ids: list[int],
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_token_ids = eos_token_ids
        self._template = None
        if chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            self._template = env.from_string(chat_template)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token as text (special tokens included), as logprobs list it."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> list[int]:
        """The exact UTF-8 bytes of one token, even half a character (chat logprobs' `bytes`):
        byte-level BPE spells each byte as one printable character of its vocab string."""
        piece = self.tokenizer.id_to_token(token_id)
        if isinstance(self.tokenizer.decoder, decoders.ByteLevel) and piece and all(c in _BYTE_OF for c in piece):
            return [_BYTE_OF[c] for c in piece]
        return list(self.token_text(token_id).encode())

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ModelLoadError("this model has no chat template", param="messages")
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte -> printable character table (what ByteLevel vocab strings are made of), inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF = _byte_level_alphabet()


def _raise_template_error(message: str) -> None:
    raise ValueError(message)


def tokenizer_from_gguf(meta: dict[str, Any]) -> ChatTokenizer:
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelLoadError(f"unsupported GGUF tokenizer {meta.get('tokenizer.ggml.model')!r} (byte-level BPE only)")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    splitters: list[Any] = []
    if meta.get("tokenizer.ggml.pre") == "smollm":
        splitters.append(pre_tokenizers.Digits(individual_digits=True))
    splitters.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splitters)
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    specials = [
        AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == GGUF_CONTROL_TOKEN
    ]
    tok.add_special_tokens(specials)

    def token(key: str) -> str | None:
        index = meta.get(key)
        return None if index is None else tokens[int(index)]

    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    eos_ids = [] if eos_id is None else [int(eos_id)]
    return ChatTokenizer(
        tok,
        meta.get("tokenizer.chat_template"),
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
        eos_ids,
    )


def tokenizer_from_folder(path: Path) -> ChatTokenizer:
    file = path / "tokenizer.json"
    if not file.exists():
        raise ModelLoadError(f"{str(path)!r} has no tokenizer.json")
    tok = Tokenizer.from_file(str(file))
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    template = config.get("chat_template")
    template_file = path / "chat_template.jinja"
    if template is None and template_file.exists():
        template = template_file.read_text()

    def token(key: str) -> str | None:
        value = config.get(key)
        return value.get("content") if isinstance(value, dict) else value

    eos = token("eos_token")
    eos_id = tok.token_to_id(eos) if eos else None
    return ChatTokenizer(tok, template, token("bos_token"), eos, [] if eos_id is None else [eos_id])


def load_tokenizer(path: str | Path) -> ChatTokenizer:
    """The tokenizer of a GGUF file or HF folder (torch-free: the API front uses it)."""
    from engine.model.gguf_file import open_gguf

    p = Path(path)
    if p.is_dir():
        return tokenizer_from_folder(p)
    if not p.is_file():
        raise ModelLoadError(f"no GGUF file or HF model folder at {str(p)!r}")
    return tokenizer_from_gguf(open_gguf(p).meta)
