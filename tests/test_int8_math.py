"""The int8 (W8A8) linear's arithmetic on random weights: per-channel weights, per-token
activations, on each integer GEMM this machine has (oneDNN through the C++ op, oneDNN from
Python, torch._int_mm), against the float product."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import cpu_attention
from engine.model import int8_linear
from engine.model.int8_linear import int8_linear as run_int8
from engine.model.int8_linear import quantize_weight
from engine.platform import machine

pytestmark = pytest.mark.unit

PATHS = ["int_mm"] + (["onednn"] if int8_linear.int8_path("cpu") == "onednn" else [])


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_int8_linear_matches_the_float_product(path: str, rows: int) -> None:
    torch.manual_seed(0)
    weight, x = torch.randn(384, 256), torch.randn(rows, 256)
    w = quantize_weight(weight, path)
    got = run_int8(x, w)
    assert got.shape == (rows, 384) and got.dtype == torch.float32
    # 8-bit weights and activations: about 1% of the product's norm; 7-bit weights about 2%.
    assert relative_error(got, x @ weight.T) < (0.02 if int8_linear.weight_qmax("cpu") == 127 else 0.035)


@pytest.mark.parametrize("path", PATHS)
def test_each_token_has_its_own_scale(path: str) -> None:
    """A row 1000x larger beside a small one: per-tensor activation scales would zero the small
    row; per-token scales keep it as accurate as alone."""
    torch.manual_seed(1)
    weight = torch.randn(128, 64)
    small, large = torch.randn(1, 64), 1000 * torch.randn(1, 64)
    w = quantize_weight(weight, path)
    together = run_int8(torch.cat([small, large]), w)
    assert torch.equal(together[:1], run_int8(small, w))  # integer sums: a row does not see its neighbours
    assert relative_error(together[:1], small @ weight.T) < 0.035


def test_a_row_of_zeros_gives_zeros() -> None:
    w = quantize_weight(torch.randn(32, 16), PATHS[-1])
    assert torch.count_nonzero(run_int8(torch.zeros(3, 16), w)) == 0


@pytest.mark.skipif("onednn" not in PATHS or not cpu_attention.available(), reason="needs oneDNN and the C++ op")
def test_the_op_and_the_python_path_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(2)
    weight, x = torch.randn(96, 64), torch.randn(5, 64)
    w = quantize_weight(weight, "onednn")
    by_op = run_int8(x, w)
    monkeypatch.setattr(cpu_attention, "available", lambda: False)
    by_python = run_int8(x, w)
    # The op rounds halves away from zero, torch.round to even: an activation's last bit may differ.
    assert relative_error(by_op, by_python) < 1e-2


def test_without_vnni_the_weights_keep_7_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's AVX2 int8 path adds two u8 x s8 products in int16 with saturation: 7-bit weights
    keep 255 * 63 * 2 under 2^15."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not int8_linear.has_int8_dot()
    assert int8_linear.weight_qmax("cpu") == (63 if machine.cpu().arch == "x86_64" else 127)
    assert int8_linear.weight_qmax("cuda") == 127
    w = quantize_weight(torch.randn(8, 16), "int_mm")
    assert int(w.packed.abs().max()) <= int8_linear.weight_qmax("cpu")
