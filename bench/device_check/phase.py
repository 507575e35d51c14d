"""One phase in its own process: `python -m bench.device_check.phase NN-name --out DIR --tmp DIR
[--dry-run]`. The orchestrator starts it with a timeout; this runs the phase module's run(ctx),
records an exception as the phase's error, and exits 1 if the phase failed.

Its own process because a phase can hang in a CUDA call or a compile, crash the interpreter or
leave the GPU in a state the next phase should not inherit: killing it is the only sure stop."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from pathlib import Path

from bench.device_check.common import ENV_FAIL, ENV_HANG, FORBIDDEN_MODULES, PhaseContext, find_phase, phases_named


def third_party_modules() -> list[str]:
    """Top-level modules imported that are not the standard library or this repository: what
    the lent machine must have installed for this phase."""
    own = {"bench", "engine", "tests", "web"}
    tops = {name.partition(".")[0] for name in list(sys.modules)}
    return sorted(t for t in tops if t not in sys.stdlib_module_names and t not in own and not t.startswith("_"))


def run_phase(ctx: PhaseContext, module_name: str) -> None:
    if ctx.name in phases_named(os.environ.get(ENV_FAIL)):
        raise RuntimeError(f"failure injected by {ENV_FAIL}={os.environ[ENV_FAIL]}")
    if ctx.name in phases_named(os.environ.get(ENV_HANG)):
        ctx.figure("hang", f"injected by {ENV_HANG}: sleeping until the timeout")
        while True:
            time.sleep(60)
    importlib.import_module(module_name).run(ctx)
    ctx.figure("third_party_modules", third_party_modules())
    present = sorted(m for m in FORBIDDEN_MODULES if sys.modules.get(m) is not None)
    ctx.check(
        "imports_nothing_absent_on_the_gpu_machine",
        not present,
        f"imported: {present or 'none'} of {FORBIDDEN_MODULES}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("name")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tmp", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--deadline", type=float, default=None, help="time.time() of the orchestrator's timeout")
    args = parser.parse_args(argv)
    spec = find_phase(args.name)
    ctx = PhaseContext(spec.name, args.out, args.tmp, args.dry_run, args.deadline)
    try:
        run_phase(ctx, spec.module)
        failed = ctx.failed_checks()
        ctx.record["status"] = "failed" if failed else "passed"
    except Exception:  # noqa: BLE001 - any error is the phase's failure, recorded with its traceback
        ctx.record["error"] = traceback.format_exc()
        ctx.record["status"] = "failed"
        traceback.print_exc()
    ctx.flush()
    return 0 if ctx.record["status"] == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
