"""`python -m engine generate --prompt ...`: stream one completion from the offline engine.

Every EngineConfig lever is a flag (`--kv-budget-mb 64`, `--paged false`, ...)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import typing

from engine.config import EngineConfig


def add_lever_flags(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        kind = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, type=_parse_bool, default=f.default, metavar="true|false")
        else:
            base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
            parser.add_argument(flag, type=base, default=f.default)


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="stream a completion for one prompt")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    add_lever_flags(gen)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    from engine.errors import InvalidParamError
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    levers = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)}
    try:
        engine = LLMEngine(EngineConfig(**levers))
        prompt = args.prompt
        if args.chat:
            prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
        engine.add_request("cli", prompt, params)
    except InvalidParamError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    while engine.has_work():
        for out in engine.step():
            print(out.new_text, end="", flush=True)
            seq = out.seq
    t = seq.times
    print(
        f"\n\n[{len(seq.output_token_ids)} tokens, finish={seq.finish_reason}, ttft={t.ttft * 1000:.0f} ms, "
        f"tpot={(t.tpot or 0) * 1000:.1f} ms]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
