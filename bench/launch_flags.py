"""The planner's `vllm serve` lines against vLLM's own argument parser (issue 29): every flag of
tests/golden/launch_flags.json's "vllm serve" list, and every launch command the planner writes
for a set of shapes, must parse. Runs where vLLM is installed (`make bench-peers` builds
.venv-peers with it): `.venv-peers/bin/python -m bench.launch_flags`. CI checks the same commands
against the golden list (tests/test_planner.py), which this keeps honest.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from engine.sim.launch_commands import launch_commands
from engine.sim.plan_space import PlanQuery, Shape

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden" / "launch_flags.json"
SHAPES = (
    Shape("h100", "fp8", 2, 1, 3, 256),
    Shape("h200", "bf16", 8, 2, 2, 1024),
    Shape("b200", "fp4", 4, 1, 6, 128, prefill_replicas=2),
    Shape("h100", "bf16", 1, 1, 8, 64),
)
QUERY = PlanQuery(model="llama-3.1-70b", rate=10, input_tokens=1000, output_tokens=250, ttft_slo_ms=1000, tpot_slo_ms=50)


def vllm_parser():  # type: ignore[no-untyped-def]
    """vLLM's `vllm serve` parser, wherever this vLLM version keeps its helpers."""
    try:  # vLLM 0.32 moved the serve parser out of the OpenAI package
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    return make_arg_parser(FlexibleArgumentParser())


def main() -> int:
    parser = vllm_parser()
    known = {s for action in parser._actions for s in action.option_strings}
    golden = json.loads(GOLDEN.read_text())["vllm serve"]
    missing = [flag for flag in golden if flag not in known]
    failures = [f"golden flag not in vLLM's parser: {flag}" for flag in missing]
    for shape in SHAPES:
        for entry in launch_commands(shape, QUERY)["vllm"]:
            argv = entry["argv"][2:]  # after `vllm serve`: the model, then the flags
            try:
                parser.parse_args(["--model", argv[0], *argv[1:]])
            except SystemExit:
                failures.append(f"does not parse: {shlex.join(entry['argv'])}")
    for line in failures:
        print(line)
    print(f"{len(golden)} golden flags, {len(SHAPES)} shapes' commands: " + ("ok" if not failures else f"{len(failures)} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
