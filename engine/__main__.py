"""`python -m engine serve --replicas N --port P`: the OpenAI-compatible API over replica processes.
`python -m engine generate --prompt ...`: stream one completion from the offline engine.

Every EngineConfig lever is a flag (`--kv-budget-mb 64`, `--paged false`, ...)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import typing

from engine.config import EngineConfig
from engine.launch.served import preload_allocator, served_levers
from engine.levers import LEVERS, parse_bool
from engine.serving.routing.defences import Defences


def add_lever_flags(parser: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """defaults: values over EngineConfig's own (serve: engine/launch/served.py)."""
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        kind = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        default = (defaults or {}).get(f.name, f.default)
        if kind is bool:
            parser.add_argument(flag, type=parse_bool, default=default, metavar="true|false")
        else:
            base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
            parser.add_argument(flag, type=base, default=default)


def add_defence_flags(parser: argparse.ArgumentParser) -> None:
    """The serving layer's defences (engine/serving/routing/defences.py): `--queue-bound false`, ..."""
    for key in Defences.names():
        parser.add_argument(
            "--" + key.replace("_", "-"), type=parse_bool, default=LEVERS[key].default, metavar="true|false",
            help=LEVERS[key].label,
        )


def _levers(args: argparse.Namespace) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API over replica processes")
    serve.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    serve.add_argument("--replicas", type=int, default=1)
    serve.add_argument(
        "--decode-replicas", type=int, default=0,
        help="a prefill/decode split: this many decode replicas behind the --replicas, which then prefill only "
        "and hand each prompt's KV over (0: colocated)",
    )
    serve.add_argument("--queue-cap", type=int, default=64)
    serve.add_argument("--deadline-s", type=float, default=30.0)
    serve.add_argument("--rate-limit", type=float, default=None, help="requests/s per API key")
    serve.add_argument("--drain-timeout-s", type=float, default=30.0)
    serve.add_argument("--sse-ping-s", type=float, default=10.0, help="interval of `: ping` on waiting streams")
    add_lever_flags(serve, served_levers())  # the fastest configuration: compiled, huge pages
    add_defence_flags(serve)
    # No lab proxy in `serve`: off, the server's own SSE writer holds each stream until it ends.
    serve.add_argument(
        "--stream-flush", type=parse_bool, default=LEVERS["stream_flush"].default, metavar="true|false",
        help="off: the server holds each SSE stream until it ends (a buffering proxy's failure)",
    )
    gen = sub.add_parser("generate", help="stream a completion for one prompt")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    add_lever_flags(gen)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.command == "serve":
        from engine.launch.api_server import serve_forever

        preload_allocator()  # the replicas start with tcmalloc
        return serve_forever(args, _levers(args))

    from engine.core.llm_engine import LLMEngine
    from engine.errors import InvalidParamError
    from engine.sampling_params import SamplingParams

    try:
        engine = LLMEngine(EngineConfig(**_levers(args)))
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
