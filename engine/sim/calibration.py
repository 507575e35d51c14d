"""Which calibration the what-if `cpu` device uses, and whether it describes this machine.

A calibration (bench/calibrate.py) fits the cost model to the live engine's own step times. It
holds only for the machine and the engine build it was measured on, so each one records its
`MachineKey`: the CPU's name, its ISA tier (the hardware's and the one in use: "AMD EPYC" names a
Zen 3 and a Zen 4 alike), the dtype the engine resolves to, its thread count and a hash of the
code a step runs. `make calibrate` writes this machine's to `.cache/calibration/<key>.json`; the
committed `cpu_calibration.json` is one reference machine's. `load()` prefers this machine's;
without one it returns the reference marked foreign, and everything that shows a prediction says
so (`status()`), so a figure fitted elsewhere is never passed off as this machine's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
REFERENCE = Path(__file__).with_name("cpu_calibration.json")
# SERVELAB_CALIBRATION_DIR: somewhere else (tests keep theirs apart from this machine's real one).
CALIBRATION_DIR = Path(os.environ.get("SERVELAB_CALIBRATION_DIR") or ROOT / ".cache" / "calibration")
# What a step's time depends on besides its shape: the model, the kernels, the runner and the
# scheduler that shapes the batch. A change to any of them makes an earlier fit stale.
STEP_CODE = ("engine/model", "engine/kernels", "engine/worker/runner.py", "engine/core/scheduler.py", "engine/sample/sampler.py",
             "engine/core/block_manager.py", "engine/core/llm_engine.py", "engine/core/memory.py")  # fmt: skip


@dataclass(frozen=True)
class MachineKey:
    cpu: str  # the CPU's name as the OS gives it
    hardware_tier: str  # what the CPU has (engine/platform/machine.py tiers)
    tier: str  # what the engine uses (SERVELAB_CPU_ISA may cap it)
    dtype: str  # the dtype the engine resolves "auto" (or the asked one) to here
    threads: int
    code: str  # STEP_CODE's hash

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def differences(self, other: dict[str, Any]) -> list[str]:
        """Fields where a recorded key (a calibration file's) differs from this one, said as
        `field: theirs (this machine: ours)`."""
        mine = asdict(self)
        return [f"{k}: {other.get(k, 'not recorded')} (this machine: {mine[k]})"
                for k in mine if other.get(k) != mine[k]]  # fmt: skip


@functools.cache
def code_hash(root: Path = ROOT) -> str:
    digest = hashlib.sha256()
    for entry in STEP_CODE:
        path = root / entry
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in (".py", ".cpp", ".h"))
        else:
            files = [path] if path.exists() else []
        for file in files:
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def this_machine(dtype: str = "auto", threads: int | None = None) -> MachineKey:
    from engine.platform import machine

    info = machine.cpu()
    resolved, _ = machine.resolve_dtype(dtype, "cpu", info)
    return MachineKey(info.model, info.hardware_tier, info.tier, resolved, threads or info.cores, code_hash())


def path_for(key: MachineKey, directory: Path | None = None) -> Path:
    return (directory or CALIBRATION_DIR) / f"{key.digest()}.json"


def running_marker(key: MachineKey, directory: Path | None = None) -> Path:
    """Exists while a calibration of this key runs: {"pid", "started"} (bench/calibrate.py)."""
    return path_for(key, directory).with_suffix(".running")


def calibrating_since(key: MachineKey, directory: Path | None = None) -> str | None:
    """When a calibration of this key that is still running started (its marker's UTC time, as
    bench/calibrate.py wrote it: nothing here reads a clock), else None."""
    marker = running_marker(key, directory)
    try:
        run = json.loads(marker.read_text())
        os.kill(int(run["pid"]), 0)  # still alive? (a killed run leaves its marker behind)
        return str(run["started"])
    except (OSError, ValueError, KeyError):
        return None


@dataclass(frozen=True)
class Calibration:
    data: dict[str, Any]  # the file: date, command, engine, device fit, front
    path: Path
    this_machine: bool
    differences: tuple[str, ...]  # why it is not this machine's (empty when it is)

    def status(self, calibrating_since: str | None = None) -> dict[str, Any]:
        """For the predict panel and the CLI: which machine the prediction describes, and since
        when this machine's own calibration has been running, if it is."""
        key = self.data.get("machine", {})
        return {
            "calibrating_since": calibrating_since,
            "this_machine": self.this_machine,
            "cpu": f"{key.get('cpu', 'an unrecorded CPU')} ({key.get('tier', 'tier not recorded')})",
            "date": self.data.get("date", ""),
            "differences": list(self.differences),
            "path": str(self.path.relative_to(ROOT)) if self.path.is_relative_to(ROOT) else str(self.path),
            "median_abs_error": self.data.get("median_abs_error"),  # the fit's, over the steps it timed
            "p90_abs_error": self.data.get("p90_abs_error"),
        }


def load(
    key: MachineKey | None = None, directory: Path | None = None, reference: Path = REFERENCE
) -> Calibration | None:
    """This machine's calibration, else the reference one marked foreign, else None."""
    key = key or this_machine()
    own = path_for(key, directory)
    if own.exists():
        return Calibration(json.loads(own.read_text()), own, True, ())
    if not reference.exists():
        return None
    data = json.loads(reference.read_text())
    recorded = data.get("machine", {})
    differences = tuple(key.differences(recorded)) if recorded else ("no machine recorded",)
    return Calibration(data, reference, not differences, differences)


def write(result: dict[str, Any], key: MachineKey, directory: Path | None = None) -> Path:
    """Store a fit as this machine's (`make calibrate`); an earlier refusal no longer stands."""
    path = path_for(key, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamped = {"machine": asdict(key), **result}  # the result carries its own "date"
    path.write_text(json.dumps(stamped, indent=2) + "\n")
    refusal_path(key, directory).unlink(missing_ok=True)
    return path


def refusal_path(key: MachineKey, directory: Path | None = None) -> Path:
    return path_for(key, directory).with_suffix(".refused")


def write_refusal(result: dict[str, Any], reason: str, key: MachineKey, directory: Path | None = None) -> Path:
    """A fit measured on a busy machine, kept apart from the fits with why it was refused
    (engine/platform/host_load.py): the predict badge says the machine is waiting to be quiet."""
    path = refusal_path(key, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": asdict(key), "reason": reason, **result}, indent=2) + "\n")
    return path


def refused(key: MachineKey, directory: Path | None = None) -> dict[str, Any] | None:
    """This key's latest refused fit ({"reason", "date", "conditions", ...}), if no fit replaced it."""
    try:
        return dict(json.loads(refusal_path(key, directory).read_text()))
    except (OSError, ValueError):
        return None


KEY_FIELDS = tuple(f.name for f in fields(MachineKey))


def describe(key: MachineKey | None = None, directory: Path | None = None) -> str:
    """Whose fit the `cpu` device is, its step error, and what this machine is waiting for: the
    words every prediction on the cpu device carries."""
    key = key or this_machine()
    return describe_found(key, load(key, directory), directory)


def describe_found(key: MachineKey, found: Calibration | None, directory: Path | None = None) -> str:
    """describe() of a calibration already loaded (a caller that also reads its status)."""
    if found is None:
        return "cpu device not calibrated (`make calibrate` fits this machine)"
    status = found.status(calibrating_since(key, directory))
    error = status["median_abs_error"]
    fit = f"step error median {error:.1%}" if isinstance(error, (int, float)) else "step error not recorded"
    if found.this_machine:
        return f"cpu device calibrated on this machine ({status['date'][:10]}; {fit})"
    words = f"cpu device calibrated on another machine ({status['cpu']}, {status['date'][:10]}; {fit}); "
    last = refused(key, directory)
    if status["calibrating_since"] is not None:
        return words + f"calibrating this machine (since {status['calibrating_since'][11:19]} UTC)"
    if last is not None:
        return words + f"waiting for a quiet machine (the try at {str(last.get('date', ''))[11:16]} UTC: {last['reason']})"
    return words + "`make calibrate` fits this one"

