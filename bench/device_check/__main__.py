"""The device check's orchestrator: `python -m bench.device_check [--dry-run] [--out DIR]`.

Runs each phase (bench/device_check/common.py PHASES) in its own subprocess with its own timeout,
its stdout and stderr to $OUT/phases/NN-name.log, its figures and checks to NN-name.json, then
writes $OUT/summary.json: every phase's status (passed / failed / timed_out / skipped, with why),
seconds and key figures, the device, the versions and the carried bytes. A phase that fails or
hangs never stops the next; summary.json is always written; the exit code is 1 if any phase failed.

DIR defaults to $OUT, else .cache/device_check. The model weights the phases load are generated
on the machine into a temporary folder, shared by the phases and deleted at the end.
--dry-run: the same phases on the CPU (Triton under its interpreter, small shapes): what CI runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.device_check import carried as carried_mod
from bench.device_check import summary as summary_mod
from bench.device_check.common import (
    DRY_BUDGET_S,
    ENV_BUDGET,
    ENV_TIMEOUTS,
    GPU_BUDGET_S,
    PHASES,
    ROOT,
    PhaseSpec,
    phases_named,
    timeout_overrides,
    write_json,
)

MIN_PHASE_S = 5.0  # below this much budget left a phase cannot even import torch: it is skipped
KILL_GRACE_S = 5.0
VERSIONED = ("torch", "triton", "transformers", "safetensors", "tokenizers", "numpy")


def default_out() -> Path:
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / ".cache" / "device_check"


def clear_previous(out: Path) -> None:
    """A previous run's files in DIR would read as this run's: remove them (only ours)."""
    for spec in PHASES:
        for suffix in (".json", ".log", ".json.tmp"):
            (out / "phases" / f"{spec.name}{suffix}").unlink(missing_ok=True)
    (out / "summary.json").unlink(missing_ok=True)


def phase_env(dry_run: bool) -> dict[str, str]:
    env = dict(os.environ)
    # The repository first; whatever PYTHONPATH held stays (a test's sitecustomize, for one).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if dry_run:
        # Before triton is imported: the kernels then run on CPU tensors (tests/support/attention_cases.py).
        env["TRITON_INTERPRET"] = "1"
    return env


def run_one(spec: PhaseSpec, timeout_s: float, out: Path, tmp: Path, dry_run: bool) -> dict[str, Any]:
    log_path = out / "phases" / f"{spec.name}.log"
    json_path = out / "phases" / f"{spec.name}.json"
    cmd = [sys.executable, "-m", "bench.device_check.phase", spec.name, "--out", str(out), "--tmp", str(tmp)]
    cmd += ["--dry-run"] if dry_run else []
    cmd += ["--deadline", f"{time.time() + timeout_s:.1f}"]
    started = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        log.write(f"$ {' '.join(cmd)}  (timeout {timeout_s:.0f} s)\n".encode())
        log.flush()
        # Its own session: a timeout kills the phase and whatever it started (compute-sanitizer).
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=phase_env(dry_run), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            exit_code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            exit_code = stop_group(proc)
    seconds = time.monotonic() - started
    record = read_record(json_path)
    status, why = summary_mod.resolve_status(record, exit_code, timed_out, timeout_s)
    # The phase's json always exists, with the final word on its status.
    final = dict(record or {"phase": spec.name, "figures": {}, "checks": {}, "skipped": {}, "warnings": []})
    final.update(status=status, why=why, seconds=round(seconds, 2), exit_code=exit_code, timeout_s=timeout_s)
    write_json(json_path, final)
    return summary_mod.phase_entry(spec, status, why, seconds, record, exit_code)


def record_skip(spec: PhaseSpec, out: Path, why: str, incomplete: bool) -> dict[str, Any]:
    """A phase not run still gets its log and json, so every phase has both."""
    (out / "phases" / f"{spec.name}.log").write_text(f"skipped: {why}\n")
    record = {"phase": spec.name, "status": "skipped", "why": why, "figures": {}, "checks": {}, "skipped": {}}
    write_json(out / "phases" / f"{spec.name}.json", record)
    return summary_mod.phase_entry(spec, "skipped", why, 0.0, incomplete=incomplete)


def stop_group(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM the phase's process group, SIGKILL what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def versions() -> dict[str, str | None]:
    """From the installed distributions' metadata: no import, so no cost and nothing to break."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_of(out: Path, dry_run: bool) -> tuple[str, dict[str, Any]]:
    """The device as 00-env saw it (the orchestrator itself never imports torch)."""
    figures = (read_record(out / "phases" / "00-env.json") or {}).get("figures", {})
    runtime = {k: figures.get(k) for k in ("torch_cuda", "gpu_capability", "gpu_total_bytes", "driver") if k in figures}
    if dry_run:
        return f"cpu: {figures.get('cpu', platform.processor() or platform.machine())}", runtime
    return str(figures.get("gpu_name", "unknown: 00-env did not say")), runtime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the CPU, Triton's interpreter, small shapes")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT, else .cache/device_check")
    parser.add_argument("--phases", default=None, help="comma-separated subset (e.g. 00,02); the rest are skipped")
    args = parser.parse_args(argv)
    out: Path = (args.out or default_out()).resolve()
    (out / "phases").mkdir(parents=True, exist_ok=True)
    clear_previous(out)
    dry_run: bool = args.dry_run
    budget = float(os.environ.get(ENV_BUDGET) or (DRY_BUDGET_S if dry_run else GPU_BUDGET_S))
    overrides = timeout_overrides(os.environ.get(ENV_TIMEOUTS))
    selected = phases_named(args.phases) if args.phases else {s.name for s in PHASES}
    started, wall_start = time.monotonic(), datetime.now(UTC)
    deadline = started + budget
    # Outside $OUT: the weights (hundreds of MB to GB) must never be carried back.
    tmp = Path(tempfile.mkdtemp(prefix="device_check_"))
    entries: list[dict[str, Any]] = []
    banked = 0.0  # seconds the phases so far left unused of their timeouts
    try:
        for spec in PHASES:
            left = deadline - time.monotonic()
            if spec.name not in selected:
                entries.append(record_skip(spec, out, "not selected (--phases)", incomplete=False))
            elif left < MIN_PHASE_S:
                why = f"the {budget:.0f} s budget is spent ({left:.0f} s left)"
                entries.append(record_skip(spec, out, why, incomplete=True))
            else:
                # A phase may use what the earlier ones left of their timeouts (an override is exact).
                own = overrides.get(spec.name, spec.timeout(dry_run) + banked)
                timeout = min(own, left)
                print(f"device_check: {spec.name} ({spec.what}), timeout {timeout:.0f} s", flush=True)
                entries.append(run_one(spec, timeout, out, tmp, dry_run))
                banked = max(0.0, own - entries[-1]["seconds"]) if spec.name not in overrides else banked
                print(
                    f"device_check: {spec.name} {entries[-1]['status']} in {entries[-1]['seconds']:.1f} s", flush=True
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        device, runtime = device_of(out, dry_run)
        meta = {
            "dry_run": dry_run,
            "started_utc": wall_start.isoformat(timespec="seconds"),
            "seconds": round(time.monotonic() - started, 2),
            "budget_s": budget,
            "device": device,
            "runtime": runtime,
            "versions": versions(),
            "host": platform.node(),
            "out": str(out),
            "carried": carried_mod.carried(ROOT, skip=(out,)),
        }
        summary = summary_mod.build_summary(entries, meta)
        write_json(out / "summary.json", summary)
    print(summary_mod.table(summary), flush=True)
    print(f"device_check: {out / 'summary.json'}", flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
