"""The GPU device check's dry run (`python -m bench.device_check --dry-run`), as CI runs it: every
phase on the CPU, in its own subprocess, with gguf and flask unimportable (the lent GPU machine has
neither), and a phase made to fail and one made to hang recorded as such while the later ones run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.device_check.common import CARRY_LIMIT_BYTES, PHASES
from bench.device_check.weights import SMOLLM2

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
# Every Python process the check starts reads this: gguf and flask are then unimportable there, as
# on the lent machine (None in sys.modules makes `import gguf` raise ImportError).
BLOCKER = "import sys\nfor _name in ('gguf', 'flask'):\n    sys.modules[_name] = None\n"
BY_DESIGN = {"00-env", "01-kernels", "02-engine", "03-memory", "04-decode"}  # each may skip parts, with reasons


def blocked_env(tmp: Path, **extra: str) -> dict[str, str]:
    site = tmp / "block_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICE_CHECK_") and k != "OUT"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    return env | extra


def dry_run(out: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    cmd = [sys.executable, "-m", "bench.device_check", "--dry-run", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    summary = json.loads((out / "summary.json").read_text())
    return proc, summary


@pytest.fixture(scope="module")
def passing(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("device_check")
    proc, summary = dry_run(tmp / "out", blocked_env(tmp))
    return proc, summary, tmp / "out"


def test_the_blocker_blocks(tmp_path: Path) -> None:
    env = blocked_env(tmp_path)
    for name in ("gguf", "flask"):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], env=env, capture_output=True, check=False)
        assert proc.returncode != 0, f"{name} was importable under the blocker"


def test_dry_run_passes_every_phase(passing: tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]) -> None:
    proc, summary, out = passing
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["ok"] and summary["dry_run"]
    assert [p["name"] for p in summary["phases"]] == [s.name for s in PHASES]
    for phase in summary["phases"]:
        assert phase["status"] == "passed", phase
        assert not phase["checks_failed"] and phase["checks_passed"] > 0, phase
        assert phase["name"] in BY_DESIGN
        assert all(reason.strip() for reason in phase["skipped"].values()), phase["skipped"]
        record = json.loads((out / "phases" / f"{phase['name']}.json").read_text())
        assert record["status"] == "passed"
        assert record["checks"]["imports_nothing_absent_on_the_gpu_machine"]["ok"]
        assert (out / "phases" / f"{phase['name']}.log").stat().st_size > 0
    # What the dry run leaves out by design, it says why.
    kernels = summary["phases"][1]
    assert "bfloat16" in kernels["skipped"] and "memcheck" in kernels["skipped"]
    assert summary["carried_bytes"] <= CARRY_LIMIT_BYTES and summary["carried_fits"]
    assert summary["versions"]["torch"] and summary["device"].startswith("cpu")


def test_dry_run_compares_what_it_says(passing: tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]) -> None:
    """The engine phase really compared tokens, preempted, and held bf16 to a looser bound than fp32."""
    _, _, out = passing
    engine = json.loads((out / "phases" / "02-engine.json").read_text())
    checks = engine["checks"]
    assert checks["device_float32/greedy_and_logprobs_vs_hf"]["detail"]["compared_tokens"] > 0
    assert engine["figures"]["device_float32/preemptions"] > 0
    assert engine["figures"]["device_float32/worst_logprob_diff_vs_hf"] < 1e-3
    memory = json.loads((out / "phases" / "03-memory.json").read_text())
    assert memory["checks"]["smollm2/kv_cache_is_the_plan"]["ok"]
    decode = json.loads((out / "phases" / "04-decode.json").read_text())
    assert decode["figures"]["smollm2/b1"]["decode_steps"] > 0


def test_a_failing_and_a_hanging_phase_do_not_stop_the_rest(tmp_path: Path) -> None:
    env = blocked_env(
        tmp_path,
        DEVICE_CHECK_FAIL="00-env,01-kernels",
        DEVICE_CHECK_HANG="02-engine",
        DEVICE_CHECK_TIMEOUTS="02-engine=3",
    )
    out = tmp_path / "out"
    proc, summary = dry_run(out, env)
    assert proc.returncode == 1
    status = {p["name"]: p["status"] for p in summary["phases"]}
    assert status == {
        "00-env": "failed",
        "01-kernels": "failed",
        "02-engine": "timed_out",
        "03-memory": "passed",
        "04-decode": "passed",
    }
    assert not summary["ok"] and summary["counts"]["failed"] == 2
    failed = json.loads((out / "phases" / "01-kernels.json").read_text())
    assert "DEVICE_CHECK_FAIL" in failed["error"] and "DEVICE_CHECK_FAIL" in summary["phases"][1]["why"]
    hung = json.loads((out / "phases" / "02-engine.json").read_text())
    assert hung["status"] == "timed_out" and "timeout" in hung["why"]
    for spec in PHASES:
        assert (out / "phases" / f"{spec.name}.log").exists() and (out / "phases" / f"{spec.name}.json").exists()


def test_smollm2_shape_is_the_shipped_models() -> None:
    """The generated weights have the real SmolLM2-135M's shape, as its GGUF's metadata says."""
    from engine.model.llama_config import gguf_config
    from engine.model.paths import default_gguf_path

    cfg = gguf_config(default_gguf_path())
    got = (SMOLLM2.vocab, SMOLLM2.hidden, SMOLLM2.intermediate, SMOLLM2.layers, SMOLLM2.heads, SMOLLM2.kv_heads)
    assert got == (
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads,
    )
    assert (SMOLLM2.head_dim, SMOLLM2.rope_theta, SMOLLM2.max_position) == (
        cfg.head_dim,
        cfg.rope_theta,
        cfg.max_position,
    )
    assert SMOLLM2.tied == cfg.tie_word_embeddings and abs(SMOLLM2.rms_norm_eps - cfg.rms_norm_eps) < 1e-9
