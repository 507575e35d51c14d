"""The CPU KV cache's memory: zeroed, huge-page aligned, and alive for as long as the tensor."""

from __future__ import annotations

import gc

import pytest
import torch

from engine.platform.huge_pages import HUGE_PAGE, zeros_on_huge_pages

pytestmark = pytest.mark.unit


def test_zeroed_aligned_and_writable() -> None:
    t = zeros_on_huge_pages((3, 100, 16, 64), torch.bfloat16)
    assert t.shape == (3, 100, 16, 64) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    assert not t.any()
    t[1, 2] = 1.5
    assert t.float().sum().item() == 1.5 * 16 * 64


def test_the_mapping_outlives_every_name_but_the_tensor() -> None:
    view = zeros_on_huge_pages((4, 1024), torch.float32).permute(1, 0)
    gc.collect()
    view.fill_(2.0)
    assert view.sum().item() == 2.0 * 4 * 1024


def test_an_empty_shape() -> None:
    assert zeros_on_huge_pages((0, 16), torch.float32).numel() == 0
