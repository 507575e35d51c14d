"""Phase 00: what the machine is. Versions (python, torch, triton, transformers), torch's CUDA,
the GPU (name, capability, total and free memory), nvidia-smi's report where it exists, the CPU,
and the bytes the device tool carries here (at most 64 MiB)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

from bench.device_check.carried import carried
from bench.device_check.common import ROOT, PhaseContext


def nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        proc = subprocess.run(["nvidia-smi"], check=False, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    return proc.stdout + proc.stderr


def run(ctx: PhaseContext) -> None:
    import torch
    import transformers
    import triton

    from engine.platform import machine

    ctx.figure("python", sys.version.split()[0], key=True)
    ctx.figure("torch", torch.__version__, key=True)
    ctx.figure("triton", triton.__version__, key=True)
    ctx.figure("transformers", transformers.__version__)
    ctx.figure("torch_cuda", torch.version.cuda, key=True)
    ctx.figure("cpu", machine.cpu().describe())
    ctx.figure("cpu_count", os.cpu_count())
    ctx.figure("platform", platform.platform())
    # fp32 matmuls on TF32 would hold the fp32 comparisons to the wrong tolerance: say which.
    ctx.figure("matmul_allow_tf32", torch.backends.cuda.matmul.allow_tf32)
    ctx.figure("float32_matmul_precision", torch.get_float32_matmul_precision())

    where = carried(ROOT, skip=(ctx.out,))
    ctx.figure("carried_bytes", where["bytes"], key=True)
    ctx.figure("carried", where)
    ctx.check("carried_fits_64MiB", where["fits"], f"{where['bytes'] / 1048576:.2f} MiB by {where['method']}")

    if ctx.dry_run:
        ctx.skip("gpu", "dry run: the device is the CPU")
        ctx.skip("nvidia_smi", "dry run: no GPU to ask about")
        return
    ctx.check("torch_is_a_cuda_build", torch.version.cuda is not None, f"torch {torch.__version__}")
    ctx.check("cuda_available", torch.cuda.is_available(), f"{torch.cuda.device_count()} device(s)")
    if not torch.cuda.is_available():
        return
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    ctx.figure("gpu_name", props.name, key=True)
    ctx.figure("gpu_capability", f"sm_{props.major}{props.minor}", key=True)
    ctx.figure("gpu_count", torch.cuda.device_count())
    ctx.figure("gpu_sms", props.multi_processor_count)
    ctx.figure("gpu_total_bytes", total, key=True)
    ctx.figure("gpu_free_bytes", free, key=True)
    ctx.figure("engine_describe_cuda", machine.describe_cuda())
    ctx.figure("engine_auto_dtype", list(machine.auto_dtype("cuda")))
    ctx.figure("bf16_supported", torch.cuda.is_bf16_supported())
    smi = nvidia_smi()
    if smi is None:
        ctx.skip("nvidia_smi", "no nvidia-smi on PATH")
    else:
        ctx.figure("nvidia_smi", smi)
        for line in smi.splitlines():
            if "Driver Version" in line:
                ctx.figure("driver", " ".join(line.split()))
    # Others' processes on the card shrink what the memory plan may take (03-memory reads it).
    ctx.check("gpu_mostly_free", free > 0.8 * total, f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free", hard=False)
