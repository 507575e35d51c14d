"""The CPU side of a serving engine's step, by engine generation (issue 42): what the host spends
scheduling, preparing inputs, sampling and processing outputs, and whether the GPU waits for it.

Measured, not fitted: Vidur's profiling of Sarathi-Serve, a vLLM derivative of 2024 (repository
microsoft/vidur, data/profiling/a100/cpu_overheads.csv, the medians, in ms), by running sequences
(batch 8 to 64) and tensor-parallel degree. Its four host stages, per step:

    TP  batch  schedule  sampler (end to end)  prepare inputs (end to end)  process outputs   sum
    1     8     0.165          0.888                  0.293                      0.624        1.970
    1    64     0.952          1.370                  1.163                      4.108        7.594
    2     8     0.179          1.156                  0.381                      0.679        2.395
    2    64     1.147          1.774                  1.232                      4.495        8.648
    4     8     0.181          1.179                  0.375                      0.787        2.522
    4    64     1.230          1.948                  1.317                      4.716        9.211

(TP 1 and 2: Llama-2-7B; TP 4: Llama-2-70B, whose costs match Llama-2-7B's at TP 4 within 1%: the
host's work follows the batch and the ranks, not the model.) Between and beyond the measured
batches each stage is linear in the running sequences; TP above 4 takes TP 4's.

How each generation pays it (`mode`):
- serial: the GPU idles while the host works (a 2024 Python engine: vLLM up to 0.5, Sarathi,
  SGLang 0.3): the step is GPU + every stage.
- multi_step: vLLM 0.6 with --num-scheduler-steps N: schedule and prepare inputs once per run of
  N steps, the sampler's host part every step, output processing asynchronous (v0.6.0 post,
  2024-09-05: "async output processing", multi-step scheduling): hidden behind the next step's GPU
  work unless longer.
- overlapped: SGLang 0.4's overlap scheduler and vLLM v1 (their 2024-12 and 2025-01 posts): the host
  prepares step n+1 while the GPU runs step n; the step is the longer of the two.
- default: the cost model's own fixed per-step overhead (constants.STEP_OVERHEAD_S, TensorRT-LLM's
  lean C++ runtime), no per-sequence host cost: every run that names no profile, unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MS = 1e-3


class HostMode(enum.StrEnum):
    DEFAULT = "default"
    SERIAL = "serial"
    MULTI_STEP = "multi_step"
    OVERLAPPED = "overlapped"


@dataclass(frozen=True)
class StageCosts:
    """One host stage's median at batch 8 and at batch 64 (seconds), linear between and beyond."""

    at8: float
    at64: float

    def at(self, batch: int) -> float:
        return max(0.0, self.at8 + (self.at64 - self.at8) * (batch - 8) / 56)


@dataclass(frozen=True)
class VidurRow:
    schedule: StageCosts
    sampler: StageCosts
    prepare: StageCosts
    process: StageCosts


# microsoft/vidur data/profiling/a100/cpu_overheads.csv, *_MEDIAN columns (ms), by TP degree.
VIDUR_A100: dict[int, VidurRow] = {
    1: VidurRow(StageCosts(0.165 * MS, 0.952 * MS), StageCosts(0.888 * MS, 1.370 * MS),
                StageCosts(0.293 * MS, 1.163 * MS), StageCosts(0.624 * MS, 4.108 * MS)),
    2: VidurRow(StageCosts(0.179 * MS, 1.147 * MS), StageCosts(1.156 * MS, 1.774 * MS),
                StageCosts(0.381 * MS, 1.232 * MS), StageCosts(0.679 * MS, 4.495 * MS)),
    4: VidurRow(StageCosts(0.181 * MS, 1.230 * MS), StageCosts(1.179 * MS, 1.948 * MS),
                StageCosts(0.375 * MS, 1.317 * MS), StageCosts(0.787 * MS, 4.716 * MS)),
}  # fmt: skip


@dataclass(frozen=True)
class HostCost:
    serial_s: float  # the GPU waits for it
    hidden_s: float  # runs beside the GPU's step: only what exceeds the step adds


@dataclass(frozen=True)
class HostProfile:
    name: str
    mode: HostMode
    engines: str  # which engines, in words
    source: str

    @property
    def defers_outputs(self) -> bool:
        """Outputs processed while the next step runs reach the client when that step ends (vLLM
        0.6's async output processing, SGLang 0.4's overlap): every token one step later."""
        return self.mode in (HostMode.MULTI_STEP, HostMode.OVERLAPPED)

    def cost(self, running: int, tp: int, scheduled: bool) -> HostCost:
        """One step's host cost with `running` sequences in the batch; `scheduled` False is a later
        step of a multi-step run (no schedule, no input preparation)."""
        if self.mode is HostMode.DEFAULT:
            return HostCost(0.0, 0.0)
        row = VIDUR_A100[min((t for t in VIDUR_A100 if t >= tp), default=4)]
        schedule, sampler = row.schedule.at(running), row.sampler.at(running)
        prepare, process = row.prepare.at(running), row.process.at(running)
        if self.mode is HostMode.SERIAL:
            return HostCost(schedule + sampler + prepare + process, 0.0)
        if self.mode is HostMode.MULTI_STEP:
            return HostCost(sampler + ((schedule + prepare) if scheduled else 0.0), process)
        return HostCost(0.0, schedule + sampler + prepare + process)


VIDUR = "microsoft/vidur data/profiling/a100/cpu_overheads.csv (Sarathi-Serve on A100, medians by batch and TP)"
PROFILES: dict[str, HostProfile] = {p.name: p for p in (
    HostProfile("default", HostMode.DEFAULT, "the cost model's fixed step overhead (TensorRT-LLM's C++ runtime)",
                "engine/sim/constants.py STEP_OVERHEAD_S"),
    HostProfile("python-2024", HostMode.SERIAL, "a 2024 Python engine: vLLM up to 0.5, Sarathi-Serve, SGLang 0.3",
                VIDUR),
    HostProfile("vllm-0.6-multistep", HostMode.MULTI_STEP, "vLLM 0.6 with --num-scheduler-steps and async output "
                "processing", VIDUR + "; vLLM v0.6.0 post, 2024-09-05"),
    HostProfile("overlapped", HostMode.OVERLAPPED, "SGLang 0.4+ (overlap scheduler), vLLM v1",
                VIDUR + "; SGLang v0.4 post, 2024-12-04; vLLM V1 post, 2025-01-27"),
)}  # fmt: skip
HOST_PROFILES = tuple(PROFILES)
