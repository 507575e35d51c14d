"""How long ServeLab takes to start: the GGUF read, an in-process engine, and the two servers from
their launch to /ready answering 200 (what every test fixture and every lab rebuild waits for).

    python -m bench.startup [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from engine.model.gguf_file import open_gguf
from engine.model.paths import default_gguf_path
from tests.support.server_process import ServerProcess


def seconds(action: Callable[[], object]) -> float:
    """How long action takes; a server it returns is stopped afterwards, outside the time."""
    start = time.monotonic()
    made = action()
    elapsed = time.monotonic() - start
    if isinstance(made, ServerProcess):
        made.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from engine import LLM

    cases = {
        "GGUF metadata and tensor table": lambda: open_gguf(default_gguf_path()),
        "LLM() in process (default KV budget)": lambda: LLM(dtype="bfloat16"),
        "python -m engine serve --kv-budget-mb 64, to /ready": lambda: ServerProcess("--kv-budget-mb", "64"),
        "python app.py --kv-budget-mb 64, to /ready": lambda: ServerProcess(
            "--kv-budget-mb", "64", command=("app.py",)
        ),
    }
    for name, action in cases.items():
        times = [seconds(action) for _ in range(args.rounds)]
        print(f"{name}: median {statistics.median(times):.2f} s ({', '.join(f'{t:.2f}' for t in times)})", flush=True)


if __name__ == "__main__":
    main()
