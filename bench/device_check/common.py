"""What the orchestrator and the phases share: the phase table, the environment switches, and
PhaseContext, through which a phase records its figures, checks and skips.

Torch-free: the orchestrator imports this, and it must start (and write summary.json) even where
torch is broken."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
CARRY_LIMIT_BYTES = 64 * MIB  # what the device tool carries to the lent machine at most
# Never on the lent machine; a phase that imports them would fail there (the check records it).
FORBIDDEN_MODULES = ("gguf", "flask")

# Switches the orchestrator and the phases honour (tests/test_device_check.py uses the first three).
ENV_FAIL = "DEVICE_CHECK_FAIL"  # comma-separated phases that raise at their start
ENV_HANG = "DEVICE_CHECK_HANG"  # comma-separated phases that sleep until their timeout
ENV_TIMEOUTS = "DEVICE_CHECK_TIMEOUTS"  # "02-engine=30,04=10": per-phase timeouts, seconds
ENV_BUDGET = "DEVICE_CHECK_BUDGET_S"  # the whole check's wall-clock budget, seconds


@dataclass(frozen=True)
class PhaseSpec:
    name: str  # "NN-name": the order, and the stem of its log and json
    module: str
    timeout_s: float  # on the GPU; the sum stays under the 8-minute budget with room to spare
    dry_timeout_s: float  # on a 2-core CPU under the interpreter
    what: str

    def timeout(self, dry_run: bool) -> float:
        return self.dry_timeout_s if dry_run else self.timeout_s


# GPU timeouts: 20 + 115 + 135 + 90 + 85 = 445 s, under the 460 s budget (each subprocess pays
# ~5-10 s importing torch and initialising CUDA; a first Triton compile ~1 s per specialisation,
# cached on disk for the later phases). What a phase leaves unused its successors may use.
PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("00-env", "bench.device_check.p00_env", 20, 60, "versions, the device, carried bytes"),
    PhaseSpec("01-kernels", "bench.device_check.p01_kernels", 115, 150, "Triton kernels against torch"),
    PhaseSpec("02-engine", "bench.device_check.p02_engine", 135, 240, "engine against CPU engine and HF"),
    PhaseSpec("03-memory", "bench.device_check.p03_memory", 90, 150, "memory plan against the allocator"),
    PhaseSpec("04-decode", "bench.device_check.p04_decode", 85, 150, "decode step against the roofline"),
)
GPU_BUDGET_S = 460.0  # 8 minutes less the kill grace (2 x 5 s), the summary and the copy back
DRY_BUDGET_S = 750.0


def find_phase(token: str) -> PhaseSpec:
    """A phase by its name ("01-kernels"), its number ("01") or its word ("kernels")."""
    for spec in PHASES:
        number, _, word = spec.name.partition("-")
        if token in (spec.name, number, word):
            return spec
    raise ValueError(f"no phase {token!r}; phases: {', '.join(s.name for s in PHASES)}")


def phases_named(value: str | None) -> set[str]:
    return {find_phase(t.strip()).name for t in (value or "").split(",") if t.strip()}


def timeout_overrides(value: str | None) -> dict[str, float]:
    """DEVICE_CHECK_TIMEOUTS="03-memory=2,04=10" -> {"03-memory": 2.0, "04-decode": 10.0}."""
    out = {}
    for item in (value or "").split(","):
        if item.strip():
            token, _, seconds = item.partition("=")
            out[find_phase(token.strip()).name] = float(seconds)
    return out


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic, so a phase killed mid-write leaves the previous complete record, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy and torch scalars
        return value.item()
    return str(value)


class PhaseContext:
    """One phase's record, written to $OUT/phases/NN-name.json after every entry, so a phase
    killed at its timeout still leaves what it had measured."""

    def __init__(self, name: str, out: Path, tmp: Path, dry_run: bool, deadline: float | None = None) -> None:
        self.name, self.out, self.tmp, self.dry_run = name, out, tmp, dry_run
        self.deadline = deadline  # time.time() at which the orchestrator kills this phase
        self.device = "cpu" if dry_run else "cuda"
        self.path = out / "phases" / f"{name}.json"
        self.started = time.monotonic()
        self.record: dict[str, Any] = {
            "phase": name,
            "dry_run": dry_run,
            "device": self.device,
            "status": "running",
            "figures": {},
            "key_figures": [],  # names the summary copies
            "checks": {},
            "skipped": {},  # what this phase did not run, and why
            "warnings": [],  # soft checks that failed: worth a look, not a failure
        }
        self.flush()

    def time_left(self) -> float:
        """Seconds before the orchestrator's timeout: a nested subprocess must end before it."""
        return float("inf") if self.deadline is None else self.deadline - time.time()

    def figure(self, name: str, value: Any, key: bool = False) -> Any:
        self.record["figures"][name] = value
        if key and name not in self.record["key_figures"]:
            self.record["key_figures"].append(name)
        self.flush()
        return value

    def check(self, name: str, ok: bool, detail: Any = None, hard: bool = True) -> bool:
        """hard: a failure fails the phase; soft: it is listed under warnings."""
        ok = bool(ok)
        self.record["checks"][name] = {"ok": ok, "hard": hard, "detail": detail}
        if not ok and not hard:
            self.record["warnings"].append(f"{name}: {detail}")
        self.flush()
        print(f"[{self.name}] {'ok  ' if ok else ('FAIL' if hard else 'warn')} {name}: {detail}", flush=True)
        return ok

    def skip(self, name: str, reason: str) -> None:
        self.record["skipped"][name] = reason
        self.flush()
        print(f"[{self.name}] skip {name}: {reason}", flush=True)

    def failed_checks(self) -> list[str]:
        return [n for n, c in self.record["checks"].items() if c["hard"] and not c["ok"]]

    def flush(self) -> None:
        self.record["seconds"] = round(time.monotonic() - self.started, 2)
        write_json(self.path, self.record)
