"""A measurement records what else the machine did, and one taken on a busy machine is refused
(engine/platform/host_load.py, bench/calibrate.py, issue 40). The busy machine here is a fake /proc
reader: the refusal must not depend on how busy the test machine happens to be."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from engine.platform import host_load
from engine.platform.host_load import ConditionMeter, CpuTimes
from engine.sim import calibration

pytestmark = pytest.mark.unit


class FakeMachine:
    """/proc/stat as a machine where others use `others` cores and the hypervisor `steal` of 2
    cores; every reading advances one second, in which this process uses `own` cores."""

    def __init__(self, others: float, own: float = 1.0, steal: float = 0.0) -> None:
        self.others, self.own, self.steal = others, own, steal
        self.t = 0.0

    def __call__(self) -> CpuTimes:
        self.t += 1.0
        return CpuTimes((self.others + self.own) * self.t, self.steal * 2 * self.t, self.own * self.t, self.t)


def test_a_quiet_machine_is_kept() -> None:
    meter = ConditionMeter(FakeMachine(others=0.05), cores=2)
    for _ in range(3):
        with meter.window() as kept:
            pass
        assert kept()
    meter.repeated([1.0, 1.02, 1.04])
    conditions = meter.conditions()
    assert conditions.others_cores == pytest.approx(0.05)
    assert conditions.spread == pytest.approx(0.04 / 1.02)
    assert conditions.refusal(fit_error=0.05) is None
    assert json.dumps(conditions.to_json())


@pytest.mark.parametrize(
    ("machine", "spread", "fit_error", "words"),
    [
        (FakeMachine(others=1.2), None, None, "other work used 1.20 cores"),
        (FakeMachine(others=0.0, steal=0.2), None, None, "hypervisor took 20%"),
        (FakeMachine(others=0.0), [1.0, 2.0], None, "spread by 67%"),
        (FakeMachine(others=0.0), None, 0.2, "median step error is 20.0%"),
    ],
)
def test_a_busy_machine_is_refused_with_its_reason(
    machine: FakeMachine, spread: list[float] | None, fit_error: float | None, words: str
) -> None:
    meter = ConditionMeter(machine, cores=2)
    with meter.window():
        pass
    if spread:
        meter.repeated(spread)
    refusal = meter.conditions().refusal(fit_error)
    assert refusal is not None and words in refusal


def test_a_pause_inside_a_window_drops_it() -> None:
    host_load.count_pauses()
    meter = ConditionMeter(FakeMachine(others=0.0), cores=2)
    with meter.window() as kept:
        os.kill(os.getpid(), signal.SIGCONT)  # what the watcher sends when it resumes a paused run
    assert not kept()
    with meter.window() as kept_after:
        pass
    assert kept_after()
    conditions = meter.conditions()
    assert conditions.pauses == 1 and conditions.seconds == pytest.approx(1.0)


def _fake_measure(config, repeats: int = 3, meter: ConditionMeter | None = None):  # type: ignore[no-untyped-def]
    """bench.calibrate.measure on a fake machine: the step times the reference constants give for
    a few shapes (so the fit, handed those constants, is exact), timed inside the meter's windows."""
    from bench.calibrate import device
    from engine.core.memory import MemoryPlan
    from engine.sim.cost_model import CostModel, StepShape
    from engine.sim.deployment import Deployment
    from engine.sim.models import get_model

    model = CostModel(Deployment(get_model("smollm2-135m"), device(np.log(_reference_values()), 2.0)))
    shapes = [StepShape(n, n, num_decodes=n, decode_context=n * c) for n in (1, 4, 16, 64) for c in (50, 200, 800)]
    shapes += [StepShape(p, 1, prefill_attention=p * (p + 1) / 2) for p in (32, 64, 128, 256, 384, 512, 768, 1024)]
    samples = []
    for shape in shapes:
        with meter.window():  # type: ignore[union-attr]
            pass
        samples.append((shape, model.step(shape).total_s))
    plan = MemoryPlan(2 << 30, 0, 0, 0, 0, 0, 16, 100)
    return samples, plan, {"num_threads": 2, "attention_impl": "fake", "compile": False}


def test_a_fit_on_a_busy_machine_is_refused_and_not_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from bench import calibrate

    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path)
    monkeypatch.setattr(calibrate, "measure", _fake_measure)
    monkeypatch.setattr(calibrate, "nelder_mead", lambda f, x0, **kw: np.log(_reference_values()))
    config = calibrate.EngineConfig(max_num_seqs=64, max_batched_tokens=512, prefix_caching=False, adaptive_threads=False)
    key = calibration.this_machine(config.dtype, 2)

    assert not calibrate.fit_and_write(config, ConditionMeter(FakeMachine(others=1.5), cores=2))
    assert not calibration.path_for(key, tmp_path).exists()  # nothing passed off as this machine's fit
    refused = calibration.refused(key, tmp_path)
    assert refused is not None and "other work used 1.50 cores" in refused["reason"]
    assert refused["conditions"]["others_cores"] == pytest.approx(1.5)
    assert "waiting for a quiet machine" in calibration.describe(key, tmp_path)

    assert calibrate.fit_and_write(config, ConditionMeter(FakeMachine(others=0.02), cores=2))
    assert calibration.path_for(key, tmp_path).exists() and calibration.refused(key, tmp_path) is None
    words = calibration.describe(key, tmp_path)
    assert "calibrated on this machine" in words and "step error median 0.0%" in words


def _reference_values() -> list[float]:
    """The reference fit's five constants, in the order bench.calibrate.device reads them."""
    fit = json.loads(calibration.REFERENCE.read_text())["device"]
    return [fit["flops"], fit["mem_bw"], fit["attention_efficiency"], fit["step_overhead_s"], fit["token_overhead_s"]]


def test_a_measurement_paused_in_every_window_is_refused() -> None:
    host_load.count_pauses()
    meter = ConditionMeter(FakeMachine(others=0.0), cores=2)
    with meter.window():
        os.kill(os.getpid(), signal.SIGCONT)
    refusal = meter.conditions().refusal()
    assert refusal is not None and "paused it in every window" in refusal
