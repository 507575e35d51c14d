"""The device check's pure parts (bench/device_check): the bytes carried to a lent machine, the
summary and its statuses, the phase table, the comparisons' margin rule, the seeded weights'
determinism. tests/test_device_check.py runs the whole dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.device_check import carried, compare, summary, weights
from bench.device_check.common import (
    CARRY_LIMIT_BYTES,
    GPU_BUDGET_S,
    PHASES,
    PhaseContext,
    find_phase,
    phases_named,
    timeout_overrides,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def test_carried_walks_a_tree_without_git(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_bytes(b"x" * 100)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "b.txt").write_bytes(b"y" * 50)
    for skipped in (".venv", ".cache", "pkg/__pycache__", "out"):
        (tmp_path / skipped).mkdir(parents=True)
        (tmp_path / skipped / "big.bin").write_bytes(b"z" * 10_000)
    got = carried.carried(tmp_path, skip=(tmp_path / "out",))
    assert got["bytes"] == 150 and got["files"] == 2 and got["fits"]
    assert got["method"].startswith("walk") and got["largest"][0] == {"path": "a.py", "bytes": 100}


def test_carried_over_the_limit_does_not_fit(tmp_path: Path) -> None:
    with open(tmp_path / "huge.bin", "wb") as f:
        f.truncate(CARRY_LIMIT_BYTES + 1)  # sparse: no disk used
    assert not carried.carried(tmp_path)["fits"]


def test_this_repository_fits() -> None:
    got = carried.carried(ROOT)
    assert got["method"].startswith("git ls-files") and got["fits"], got["largest"]


def test_phase_table_fits_the_eight_minutes() -> None:
    assert [s.name for s in PHASES] == ["00-env", "01-kernels", "02-engine", "03-memory", "04-decode"]
    assert sum(s.timeout_s for s in PHASES) <= GPU_BUDGET_S <= 8 * 60 - 10
    assert find_phase("01").name == find_phase("kernels").name == "01-kernels"
    assert phases_named("00, decode") == {"00-env", "04-decode"}
    assert timeout_overrides("02=3,03-memory=1.5") == {"02-engine": 3.0, "03-memory": 1.5}
    with pytest.raises(ValueError):
        find_phase("99")


def test_resolve_status() -> None:
    ok = {"status": "passed", "checks": {}}
    bad = {"status": "failed", "checks": {"x": {"ok": False, "hard": True}}}
    assert summary.resolve_status(ok, 0, False, 10) == ("passed", None)
    assert summary.resolve_status(ok, 0, True, 10)[0] == "timed_out"
    assert summary.resolve_status(None, -9, False, 10) == ("failed", "wrote no result (exit code -9)")
    assert summary.resolve_status(bad, 1, False, 10) == ("failed", "failed checks: x")
    assert (
        summary.resolve_status({**bad, "error": "Traceback\nRuntimeError: boom"}, 1, False, 10)[1]
        == "RuntimeError: boom"
    )
    assert summary.resolve_status(ok, 139, False, 10)[0] == "failed"  # crashed after writing passed
    assert summary.resolve_status({"status": "running"}, 0, False, 10)[0] == "failed"


def test_build_summary() -> None:
    record = {
        "figures": {"a": 1.5, "b": 2},
        "key_figures": ["a"],
        "checks": {"c1": {"ok": True, "hard": True}, "c2": {"ok": False, "hard": False}},
        "skipped": {"bf16": "interpreter"},
        "warnings": ["c2: slow"],
    }
    passed = summary.phase_entry(PHASES[0], "passed", None, 1.234, record, 0)
    assert passed["key_figures"] == {"a": 1.5} and passed["checks_passed"] == 1 and passed["checks_failed"] == []
    fits = {"bytes": 10, "limit_bytes": CARRY_LIMIT_BYTES, "fits": True}
    meta = {"dry_run": True, "device": "cpu", "carried": fits}
    chosen = summary.phase_entry(PHASES[1], "skipped", "not selected", 0.0)
    out = summary.build_summary([passed, chosen], meta)
    assert out["ok"] and out["carried_bytes"] == 10 and out["counts"]["skipped"] == 1
    budget = summary.phase_entry(PHASES[2], "skipped", "budget spent", 0.0, incomplete=True)
    assert not summary.build_summary([passed, budget], meta)["ok"]
    assert not summary.build_summary([passed], {**meta, "carried": {**fits, "fits": False}})["ok"]
    assert "OK" in summary.table(out) and "00-env" in summary.table(out)


def test_phase_context_records_as_it_goes(tmp_path: Path) -> None:
    (tmp_path / "phases").mkdir()
    ctx = PhaseContext("01-kernels", tmp_path, tmp_path, dry_run=True)
    ctx.figure("x", 3, key=True)
    ctx.check("soft", False, "slow", hard=False)
    ctx.check("hard", True, "fine")
    ctx.skip("bf16", "interpreter")
    written = json.loads((tmp_path / "phases" / "01-kernels.json").read_text())
    assert written["key_figures"] == ["x"] and written["skipped"] == {"bf16": "interpreter"}
    assert written["warnings"] == ["soft: slow"] and ctx.failed_checks() == []
    ctx.check("broken", False, "no")
    assert ctx.failed_checks() == ["broken"] and written["status"] == "running"


def test_margin_rule() -> None:
    ref = compare.Reference(argmax=[5, 6, 7], margin=[2.0, 0.01, 2.0], logprob=[-0.1, -0.7, -0.2])
    flip_at_tie = compare.Generated([1], [5, 9, 7], [-0.1, -0.7, -0.2])
    assert compare.against_reference(flip_at_tie, ref, 0.25, 0.3)["ok"]  # a near tie may flip
    flip_clear = compare.Generated([1], [5, 6, 9], [-0.1, -0.7, -0.2])
    result = compare.against_reference(flip_clear, ref, 0.25, 0.3)
    assert not result["ok"] and result["mismatches"][0]["pos"] == 2
    off = compare.Generated([1], [5, 6, 7], [-0.1, -0.7, -0.9])
    assert not compare.against_reference(off, ref, 0.25, 0.3)["ok"]  # logprob 0.7 from the reference


def test_between_runs_allows_a_divergence_only_at_a_near_tie() -> None:
    a = compare.Generated([1], [5, 6, 7], [-0.1, -0.2, -0.3])
    ref = compare.Reference([5, 6, 7], [1.0, 0.01, 1.0], [-0.1, -0.2, -0.3])
    at_tie = compare.between_runs(a, compare.Generated([1], [5, 8, 8], [-0.1, -0.2, -0.3]), ref, 0.25, 0.3)
    assert at_tie["ok"] and at_tie["diverged_at"] == 1
    clear = compare.between_runs(a, compare.Generated([1], [8, 6, 7], [-0.1, -0.2, -0.3]), ref, 0.25, 0.3)
    assert not clear["ok"] and clear["diverged_at"] == 0
    same = compare.between_runs(a, a, ref, 0.0, 0.0)
    assert same["ok"] and same["diverged_at"] is None and same["shared_tokens"] == 3


def test_weights_are_seeded_per_tensor() -> None:
    one = weights.draw("model.layers.0.mlp.up_proj.weight", (4, 8), 0.02)
    assert torch.equal(one, weights.draw("model.layers.0.mlp.up_proj.weight", (4, 8), 0.02))
    assert not torch.equal(one, weights.draw("model.layers.1.mlp.up_proj.weight", (4, 8), 0.02))
    assert one.dtype == torch.bfloat16 and torch.equal(
        weights.draw("n", (3,), 0.0), torch.ones(3, dtype=torch.bfloat16)
    )


def test_generated_config_reads_as_the_shape(tmp_path: Path) -> None:
    from engine.model.llama_config import model_config

    for shape in (weights.SMOLLM2, weights.LLAMA8B_LAYER, weights.dry_run_shape(weights.LLAMA8B_LAYER)):
        (tmp_path / "config.json").write_text(json.dumps(weights.hf_config(shape)))
        cfg = model_config(tmp_path)
        got = (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size)
        assert got == (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.head_dim, shape.vocab)
        assert cfg.tie_word_embeddings == shape.tied and cfg.rope_theta == shape.rope_theta
        specs = weights.tensor_specs(shape)
        assert ("lm_head.weight" in specs) == (not shape.tied)
        assert len(specs) == 2 + 9 * shape.layers + (0 if shape.tied else 1)
