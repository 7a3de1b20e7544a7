"""benchmarks/kernels/probe_stem.py's space-to-depth stem computes ResNet's 7x7 stride-2 stem
convolution exactly (float64): outputs and the 7x7 weight's gradient."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
from probe_stem import fold_weight, stem_s2d


@pytest.mark.parametrize("channels", [0, 16])
@pytest.mark.parametrize("size", [(32, 32), (30, 44)])
def test_the_folded_stem_equals_the_stride_2_convolution(channels, size):
    torch.manual_seed(0)
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    w = torch.randn(8, 3, 7, 7, dtype=torch.float64, requires_grad=True)
    want = F.conv2d(x, w, stride=2, padding=3)
    got = stem_s2d(x, w, channels)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    (dw_want,) = torch.autograd.grad(want, w, g)
    (dw_got,) = torch.autograd.grad(got, w, g)
    torch.testing.assert_close(dw_got, dw_want)


def test_the_folded_kernel_has_the_taps_where_the_sums_need_them():
    w = torch.arange(2 * 3 * 49, dtype=torch.float64).reshape(2, 3, 7, 7)
    folded = fold_weight(w)
    assert folded.shape == (2, 12, 4, 4)
    # W'[o, 4c + 2p + q, a, b] = w[o, c, 2a + p, 2b + q], 0 past the 7x7 kernel
    assert folded[1, 4 * 2 + 2 * 1 + 0, 2, 3] == w[1, 2, 5, 6]
    assert folded[0, 4 * 0 + 2 * 1 + 1, 3, 0] == 0  # row 7 does not exist
    with pytest.raises(ValueError, match="7x7"):
        fold_weight(torch.zeros(2, 3, 3, 3))
