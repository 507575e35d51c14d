"""Record Hugging Face transformers' greedy outputs for the default GGUF model.

Writes `tests/reference/hf_greedy.json`, so engine tests can compare token ids against
transformers without running it in CI. transformers dequantizes the Q4_1 GGUF to dense
float32 weights (it needs `accelerate` installed to load a GGUF); the tokenizer is
transformers' own, built from the same GGUF's metadata.

Each prompt is fed exactly as recorded in `prompt_ids` (one prompt at a time, no padding,
greedy, `max_new_tokens` new tokens or until EOS). For every generated position the file
keeps the raw-logit margin between the best and the second-best token (`margins`) and the
second-best token id (`runner_up_ids`), so a test can stop comparing before a near tie.

Rerun from the repository root (about 1-2 minutes on one CPU thread):
    PYTHONPATH=. .venv/bin/python tests/reference/record_hf.py [--gguf PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.model.gguf_file import open_gguf
from engine.model.paths import default_gguf_path
from engine.model.tokenizer import tokenizer_from_gguf

OUT_DEFAULT = Path(__file__).resolve().parent / "hf_greedy.json"
MAX_NEW_TOKENS = 24
# Prompts whose smallest margin over the generated tokens is below this are flagged.
MARGIN_WARN = 0.5

Message = dict[str, str]

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

# ~200-token "system" text shared by the two prefix-caching prompts.
SHARED_SYSTEM = (
    "You are the help desk assistant of the Riverside Public Library. The library "
    "is open from 9 am to 8 pm on weekdays and from 10 am to 5 pm on Saturdays; it "
    "is closed on Sundays and public holidays. Members may borrow up to twelve items "
    "at a time. Books can be kept for three weeks, while films and music can be "
    "kept for one week. Loans can be renewed twice online unless another member has "
    "reserved the item. Late returns cost twenty cents per day for each item. A "
    "library card is free for everyone who lives, works or studies in the city; "
    "visitors can buy a temporary card for five dollars. The library has three "
    "floors: the ground floor holds the fiction collection and the cafe, the first "
    "floor holds non-fiction and the study rooms, and the second floor holds the "
    "children's section and the local history archive. Study rooms can be booked "
    "for up to two hours per day. Always answer politely, briefly and only with "
    "facts from this description."
)

# Sentences for the long prompt: real English, recombined deterministically.
_LONG_SENTENCES = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the harbor.",
    "Its keeper, a quiet man named Tobias Wren, had lived there for thirty years.",
    "Every evening he climbed the spiral stairs to light the great lamp.",
    "Fishing boats returned at dusk, guided by the steady white beam.",
    "In winter the storms came from the north and shook the windows of the town.",
    "The baker on the corner opened her shop before sunrise each morning.",
    "Children walked along the sea wall on their way to the small school.",
    "Merchants brought wool, salt and timber from the villages inland.",
    "On market days the square filled with voices, carts and the smell of bread.",
    "The old harbor master kept a careful record of every ship that arrived.",
    "Gulls circled above the nets that were spread out to dry on the pier.",
    "In spring the hills behind the town turned green and then yellow with gorse.",
    "A new railway line reached the town and brought visitors from the city.",
    "Some of the visitors painted the cliffs, and others simply walked the beach.",
    "The keeper wrote letters to his sister describing the changing sea.",
    "At night the town was silent except for the waves and the turning lamp.",
    "Repairs to the pier took most of the summer and cost more than planned.",
    "The schoolteacher taught the children to read the tide tables.",
    "Autumn brought fog that rolled in from the sea without warning.",
    "On clear nights the keeper could see the lights of ships far out at sea.",
)
_OPENERS = (
    "In those years,",
    "People in the town still remember that",
    "According to the harbor records,",
    "It is often said that",
    "As the seasons passed,",
    "Long before the railway came,",
    "Visitors were usually surprised that",
)
LONG_PARAGRAPHS = 29


def long_text() -> str:
    """About 1,500 tokens of varied English prose, built without randomness."""
    n = len(_LONG_SENTENCES)
    paragraphs: list[str] = []
    for i in range(LONG_PARAGRAPHS):
        picks = [(i * 7 + j * 3) % n for j in range(3)]
        first = _LONG_SENTENCES[picks[0]]
        opener = _OPENERS[i % len(_OPENERS)]
        lead = f"{opener} {first[0].lower()}{first[1:]}"
        rest = " ".join(_LONG_SENTENCES[k] for k in picks[1:])
        paragraphs.append(f"{lead} {rest}")
    body = "\n\n".join(paragraphs)
    return (
        f"{body}\n\nQuestion: What was the name of the lighthouse keeper in the story "
        "above?\nAnswer: The lighthouse keeper was named"
    )


def prompt_specs() -> list[dict[str, Any]]:
    """The fixed prompt list: `text` is fed as is; `messages` go through the template.

    Chosen so that greedy decoding has no near tie (top-1/top-2 logit margin >= 0.5) over
    the first 24 tokens; free-form prompts on this 135M model nearly always have one.
    """
    return [
        {
            "name": "factual_qa",
            "text": (
                "Q: What is the largest planet in the solar system?\nA: Jupiter.\n"
                "Q: What is the smallest planet in the solar system?\nA:"
            ),
        },
        {
            "name": "code_python",
            "text": (
                "def square(x: int) -> int:\n    return x * x\n\n\nassert square(2) == 4\nassert square(3) == 9\n"
            ),
        },
        {
            "name": "code_list_literal",
            "text": 'MONTHS = [\n    "January",\n    "February",\n    "March",\n',
        },
        {
            "name": "list_weekdays",
            "text": "Days of the week:\n1. Monday\n2. Tuesday\n3.",
        },
        {
            "name": "non_english_spanish",
            "text": "¿Dónde está la biblioteca? ¿Dónde está la biblioteca? ¿Dónde",
        },
        {
            "name": "unicode_accents_stars",
            "text": "⭐⭐⭐⭐⭐ café ☕ — naïve résumé — ⭐⭐⭐",
        },
        {
            "name": "emoji_pattern",
            "text": "Smile: 😀\nSmile: 😀\nSmile: 😀\nSmile:",
        },
        {
            "name": "numbers_many_digits",
            "text": ("Account 4815162342, account 4815162343, account 4815162344, account"),
        },
        {
            "name": "numbers_decimals",
            "text": ("3.14159265358979323846, 2.71828182845904523536, 1.41421356237309504880,"),
        },
        {
            "name": "chat_count",
            "messages": [{"role": "user", "content": "Count from 1 to 10."}],
        },
        {
            "name": "shared_prefix_weekdays",
            "messages": [
                {"role": "system", "content": SHARED_SYSTEM},
                {"role": "user", "content": "Name the seven days of the week."},
            ],
        },
        {
            "name": "shared_prefix_primes",
            "messages": [
                {"role": "system", "content": SHARED_SYSTEM},
                {"role": "user", "content": "List the first five prime numbers."},
            ],
        },
        {"name": "long_story", "text": long_text()},
    ]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def record_one(model: Any, tokenizer: Any, spec: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """Render, tokenize and greedily continue one prompt; return its JSON record."""
    messages: list[Message] | None = spec.get("messages")
    if messages is not None:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        templ = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        templ_ids = list(templ["input_ids"] if hasattr(templ, "keys") else templ)
    else:
        text = spec["text"]
        templ_ids = None
    prompt_ids: list[int] = tokenizer(text)["input_ids"]
    if templ_ids is not None and templ_ids != prompt_ids:
        raise RuntimeError(f"{spec['name']}: chat template ids differ from encode(text)")
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
        )
    output_ids = [int(t) for t in out.sequences[0, len(prompt_ids) :]]
    margins: list[float] = []
    runner_up: list[int] = []
    for pos, logits in enumerate(out.logits):
        top = torch.topk(logits[0].float(), 2)
        if int(top.indices[0]) != output_ids[pos]:
            raise RuntimeError(f"{spec['name']}: generated id is not the logit argmax")
        margins.append(round(float(top.values[0] - top.values[1]), 4))
        runner_up.append(int(top.indices[1]))
    record: dict[str, Any] = {"name": spec["name"]}
    if messages is not None:
        record["messages"] = messages
    record.update(
        {
            "text": text,
            "prompt_ids": prompt_ids,
            "output_ids": output_ids,
            "output_text": tokenizer.decode(output_ids, skip_special_tokens=False),
            "stopped_on_eos": bool(output_ids) and output_ids[-1] == model.generation_config.eos_token_id,
            "margins": margins,
            "runner_up_ids": runner_up,
            "min_margin": min(margins),
            "min_margin_pos": margins.index(min(margins)),
        }
    )
    return record


def _dump(obj: Any, indent: int = 0) -> str:
    """JSON with dicts and lists of dicts expanded, and lists of scalars on one line."""
    pad = "  " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k)}: {_dump(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [f"{pad}{_dump(v, indent + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="default: the wheel's")
    parser.add_argument("--out", type=Path, default=OUT_DEFAULT)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--only", nargs="*", help="record only these prompt names")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    gguf = (args.gguf or default_gguf_path()).resolve()
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    print(f"loaded in {time.perf_counter() - start:.1f}s", file=sys.stderr)

    specs = prompt_specs()
    if args.only:
        specs = [s for s in specs if s["name"] in args.only]
    records: list[dict[str, Any]] = []
    for spec in specs:
        t0 = time.perf_counter()
        rec = record_one(model, tokenizer, spec, args.max_new_tokens)
        records.append(rec)
        flag = "  <-- near tie" if rec["min_margin"] < MARGIN_WARN else ""
        print(
            f"{rec['name']:<22} prompt={len(rec['prompt_ids']):>5} "
            f"new={len(rec['output_ids']):>3} min_margin={rec['min_margin']:.3f}"
            f"@{rec['min_margin_pos']} ({time.perf_counter() - t0:.1f}s){flag}"
            f"  {rec['output_text']!r}",
            file=sys.stderr,
        )

    # Where the upstream SmolLM2 / llama.cpp "smollm" pre-tokenizer (digits split off
    # first) would give other ids than transformers' GGUF tokenizer did.
    split = tokenizer_from_gguf(open_gguf(gguf).meta).tokenizer  # the engine's own
    for rec in records:
        rec["split_digits_ids_match"] = split.encode(rec["text"]).ids == rec["prompt_ids"]
    tok_cases: list[dict[str, Any]] = []
    for text in TOKENIZER_CASES:
        case: dict[str, Any] = {"text": text, "ids": tokenizer(text)["input_ids"]}
        split_ids = split.encode(text).ids
        if split_ids != case["ids"]:
            case["ids_split_digits"] = split_ids
        tok_cases.append(case)

    by_name = {r["name"]: r for r in records}
    shared: dict[str, Any] = {}
    a, b = by_name.get("shared_prefix_weekdays"), by_name.get("shared_prefix_primes")
    if a and b:
        n = 0
        for x, y in zip(a["prompt_ids"], b["prompt_ids"]):
            if x != y:
                break
            n += 1
        shared = {"prompts": [a["name"], b["name"]], "common_prefix_tokens": n}

    gen = model.generation_config
    result = {
        "description": "HF transformers greedy reference; see tests/reference/record_hf.py",
        "gguf_file": gguf.name,
        "gguf_sha256": sha256_file(gguf),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "dtype": "float32",
        "torch_threads": args.threads,
        "max_new_tokens": args.max_new_tokens,
        "eos_token_id": gen.eos_token_id,
        "tokenizer": {
            "bos_token": tokenizer.bos_token,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token": tokenizer.eos_token,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "special_ids": {
                t: tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
            },
            "adds_bos": tokenizer("a")["input_ids"][0] == tokenizer.bos_token_id,
        },
        "chat_template": tokenizer.chat_template,
        "shared_prefix": shared,
        "prompts": records,
        "tokenizer_cases_note": (
            "ids: transformers' GGUF tokenizer (plain ByteLevel regex); "
            "ids_split_digits, only where different: Digits(individual_digits=True) "
            "before ByteLevel, as upstream SmolLM2 and llama.cpp 'smollm'"
        ),
        "tokenizer_cases": tok_cases,
    }
    args.out.write_text(_dump(result) + "\n", encoding="utf-8")
    total = time.perf_counter() - start
    print(f"wrote {args.out} ({len(records)} prompts, {total:.1f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
