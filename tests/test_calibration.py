"""Which calibration the what-if `cpu` device uses (engine/sim/calibration.py): keyed on the
machine and the step code, this machine's preferred, another machine's never passed off as this
one's (the prediction's badge and status say whose it is)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from engine.sim import calibration
from engine.sim.calibration import MachineKey

pytestmark = pytest.mark.integration


def key(**changes: object) -> MachineKey:
    base = MachineKey("AMD EPYC", "avx512_bf16", "avx2", "float32", 2, "abc123")
    return replace(base, **changes)


FIT = {"date": "2026-12-03T13:00:00+00:00", "device": {"memory_gb": 2.0, "flops": 1e11, "mem_bw": 1e10}}


def test_the_key_tells_apart_what_changes_a_steps_time() -> None:
    digests = {key().digest()}
    for change in ({"tier": "avx512_bf16"}, {"dtype": "bfloat16"}, {"threads": 1}, {"code": "def456"}, {"cpu": "x"}):
        digests.add(key(**change).digest())
    assert len(digests) == 6 and key().digest() == key().digest()


def test_this_machines_calibration_is_preferred_and_the_reference_is_named_foreign(tmp_path: Path) -> None:
    reference = tmp_path / "reference.json"
    foreign = asdict(key(tier="amx", hardware_tier="amx", dtype="bfloat16"))
    reference.write_text(json.dumps({"machine": foreign, **FIT}))
    found = calibration.load(key(), tmp_path / "mine", reference)
    assert found is not None and not found.this_machine
    assert (
        "tier: amx (this machine: avx2)" in found.differences
        and "dtype: bfloat16 (this machine: float32)" in found.differences
    )
    status = found.status()
    assert (
        status["this_machine"] is False
        and status["cpu"] == "AMD EPYC (amx)"
        and status["date"].startswith("2026-12-03")
    )
    written = calibration.write(FIT, key(), tmp_path / "mine")
    assert json.loads(written.read_text())["machine"]["tier"] == "avx2"
    found = calibration.load(key(), tmp_path / "mine", reference)
    assert found is not None and found.this_machine and found.path == written and found.differences == ()
    other = calibration.load(key(code="changed"), tmp_path / "mine", reference)  # the engine changed: stale
    assert other is not None and not other.this_machine and other.path == reference


def test_a_reference_without_a_recorded_machine_is_foreign(tmp_path: Path) -> None:
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(FIT))
    found = calibration.load(key(), tmp_path, reference)
    assert found is not None and not found.this_machine and found.differences == ("no machine recorded",)
    assert calibration.load(key(), tmp_path, tmp_path / "absent.json") is None


def test_the_step_codes_hash_follows_its_files(tmp_path: Path) -> None:
    model = tmp_path / "engine" / "model"
    model.mkdir(parents=True)
    (model / "llama.py").write_text("x = 1\n")
    (tmp_path / "engine" / "runner.py").write_text("y = 1\n")
    before = calibration.code_hash(tmp_path)
    (model / "llama.py").write_text("x = 2\n")
    calibration.code_hash.cache_clear()
    assert calibration.code_hash(tmp_path) != before


def test_a_prediction_on_another_machines_calibration_says_whose(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from engine.lab.simulated.predict import predict
    from engine.levers import LEVERS

    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)  # no calibration of this machine
    levers = {k: lever.default for k, lever in LEVERS.items()} | {"request_rate": 1.0, "max_num_seqs": 16}
    out = predict(levers)
    assert out["calibration"]["this_machine"] is False
    assert "calibrated on another machine" in out["badge"] and "make calibrate" in out["badge"]
    calibration.write(json.loads(calibration.REFERENCE.read_text()), calibration.this_machine(), tmp_path)
    out = predict(levers)
    assert out["calibration"]["this_machine"] is True and "calibrated on this machine" in out["badge"]


def test_a_running_calibration_is_said_and_a_dead_ones_marker_is_not(tmp_path: Path) -> None:
    marker = calibration.running_marker(key(), tmp_path)
    marker.write_text(json.dumps({"pid": os.getpid(), "started": "2026-12-03T14:08:12+00:00"}))
    assert calibration.calibrating_since(key(), tmp_path) == "2026-12-03T14:08:12+00:00"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    marker.write_text(json.dumps({"pid": dead.pid, "started": "2026-12-03T14:08:12+00:00"}))
    assert calibration.calibrating_since(key(), tmp_path) is None


def test_make_runs_background_calibration_starts_once_at_the_lowest_priority(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """app.py --calibrate-in-background: the real `python -m bench.calibrate --background`,
    niced and idle-class, its marker naming it; a second start while it runs starts nothing; the
    server's stop ends it and reaps it."""
    import app

    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    monkeypatch.setenv("SERVELAB_CALIBRATION_DIR", str(tmp_path))  # the child's too
    this = calibration.this_machine()
    runner = app.start_background_calibration(lambda: False)
    assert runner is not None
    deadline = time.monotonic() + 60
    while calibration.calibrating_since(this, tmp_path) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    run = json.loads(calibration.running_marker(this, tmp_path).read_text())
    try:
        assert run["pid"] == runner.pid
        assert os.getpriority(os.PRIO_PROCESS, run["pid"]) == 19
        if sys.platform == "linux":
            assert os.sched_getscheduler(run["pid"]) == os.SCHED_IDLE
        assert app.start_background_calibration(lambda: False) is None  # already running: nothing new
        assert len(list(tmp_path.glob("*.log"))) == 1
    finally:
        runner.stop()
    assert runner.process is not None and runner.process.returncode is not None  # reaped, no zombie
