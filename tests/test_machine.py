"""The capability probe (engine/platform/machine.py): what it reads off this CPU, the tiers and their
override, and what `auto` chooses on each class of machine. No model is loaded here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.platform import cpu_features, machine
from engine.platform.machine import ARM_TIERS, X86_TIERS, CpuInfo

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def probe_in_subprocess(env: dict[str, str], code: str) -> dict:
    """Run `code` (which prints one JSON line) in a fresh interpreter with env added."""
    # The torch caps this process may carry (a run under SERVELAB_CPU_ISA) would win over the child's.
    inherited = {k: v for k, v in os.environ.items() if k not in machine.TORCH_CAPS["scalar"]}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**inherited, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_probe_reads_this_cpu() -> None:
    info = machine.cpu()
    assert info.cores >= 1 and info.model
    if info.arch == "x86_64":
        assert info.source in ("cpuid", "/proc/cpuinfo")
        assert info.hardware_tier in X86_TIERS
        # CPUID and the kernel's flags agree on what decides a tier.
        proc, _ = cpu_features.proc_cpuinfo()
        if proc and info.source == "cpuid":
            for feature in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"):
                assert (feature in info.hardware_features) == (feature in proc), feature
    else:
        assert info.hardware_tier in ARM_TIERS + ("scalar",)


@pytest.mark.parametrize(
    ("tier", "dtype"),
    [("amx", "bfloat16"), ("avx512_bf16", "bfloat16"), ("avx512", "float32"), ("avx2", "float32"), ("scalar", "float32")],
)
def test_auto_is_bf16_only_where_the_cpu_multiplies_it(tier: str, dtype: str) -> None:
    chosen, why = machine.auto_dtype("cpu", CpuInfo.of_tier(tier))
    assert chosen == dtype
    assert ("natively" in why) == (dtype == "bfloat16")
    if dtype == "float32":
        assert why == f"this CPU has no native bf16 ({tier})"


@pytest.mark.parametrize(("tier", "dtype"), [("neon_bf16", "bfloat16"), ("neon", "float32")])
def test_auto_on_arm(tier: str, dtype: str) -> None:
    assert machine.auto_dtype("cpu", CpuInfo.of_tier(tier, "aarch64"))[0] == dtype


def test_explicit_bf16_without_native_bf16_says_it_is_slower() -> None:
    dtype, why = machine.resolve_dtype("bfloat16", "cpu", CpuInfo.of_tier("avx2"))
    assert dtype == "bfloat16" and "no native bf16 (avx2)" in why and "slower" in why
    assert machine.resolve_dtype("float32", "cpu", CpuInfo.of_tier("avx2")) == ("float32", "asked")


def test_a_tier_keeps_only_its_features() -> None:
    full = CpuInfo.of_tier("amx")
    capped = CpuInfo(**{**full.__dict__, "tier": "avx2", "override": "avx2"})
    assert capped.has("avx2") and capped.has("fma") and not capped.has("avx512f") and not capped.has("amx_tile")
    assert not capped.native_bf16 and not capped.onednn_bf16
    assert CpuInfo.of_tier("avx512").onednn_bf16 and not CpuInfo.of_tier("avx512").native_bf16


def test_the_override_caps_the_tier_in_a_fresh_process() -> None:
    if machine.cpu().arch != "x86_64":
        pytest.skip("x86-64 tiers")
    code = (
        "import json, os; from engine.platform import machine; c = machine.cpu(); "
        "print(json.dumps({'tier': c.tier, 'hw': c.hardware_tier, 'onednn': os.environ.get('ONEDNN_MAX_CPU_ISA'), "
        "'aten': os.environ.get('ATEN_CPU_CAPABILITY'), 'dtype': machine.auto_dtype('cpu')[0]}))"
    )
    seen = probe_in_subprocess({"SERVELAB_CPU_ISA": "scalar"}, code)
    assert seen == {"tier": "scalar", "hw": machine.cpu().hardware_tier, "onednn": "SSE41", "aten": "default", "dtype": "float32"}
    if machine.cpu().hardware_tier != "scalar":
        seen = probe_in_subprocess({"SERVELAB_CPU_ISA": "avx2"}, code)
        assert (seen["tier"], seen["onednn"], seen["aten"], seen["dtype"]) == ("avx2", "AVX2", "avx2", "float32")
        # torch itself then runs its AVX2 kernels, as on an AVX2 CPU
        code_torch = "import json, engine, torch; print(json.dumps(torch.backends.cpu.get_cpu_capability()))"
        assert probe_in_subprocess({"SERVELAB_CPU_ISA": "avx2"}, code_torch) == "AVX2"


def test_an_override_above_the_hardware_or_unknown_is_refused() -> None:
    info = machine.cpu()
    tiers = X86_TIERS if info.arch == "x86_64" else ARM_TIERS
    code = "from engine.platform import machine; machine.cpu()"
    for value in ([tiers[-1]] if info.hardware_tier != tiers[-1] else []) + ["pentium"]:
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(ROOT), "SERVELAB_CPU_ISA": value},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode != 0 and "SERVELAB_CPU_ISA" in out.stderr, out.stderr


def test_a_server_refuses_a_bad_override_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "engine", "serve", "--port", "0"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "SERVELAB_CPU_ISA": "pentium"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("cannot serve: SERVELAB_CPU_ISA=pentium"), out.stderr


@pytest.mark.parametrize(("capability", "dtype"), [((9, 0), "bfloat16"), ((8, 0), "bfloat16"), ((7, 5), "float16")])
def test_auto_on_cuda(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], dtype: str) -> None:
    """What the device check (bench/device_check) sees on a real GPU, here on a described one;
    cuda:N reads card N."""
    asked: list[int] = []
    monkeypatch.setattr(machine, "cuda", lambda index=0: asked.append(index) or machine.CudaInfo("a GPU", capability, 2))
    assert machine.auto_dtype("cuda:0")[0] == dtype and machine.auto_dtype("cuda:1")[0] == dtype
    assert asked == [0, 1]
    assert machine.linear_path(dtype, "cuda") == "cublas" and machine.attention_path("cuda", False) == "triton"
