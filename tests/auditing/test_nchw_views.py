"""nchw-conv counts the copies channels_last removes beside cuDNN's conversions: a LayerNorm's
copy of an NHWC view of NCHW activations and a convolution backward's copy of its gradient
(ConvNeXt's and Swin's stem: a patch convolution normed over its channels)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpushape.auditing import audit
from gpushape.hardware import get_gpu
from gpushape.tracing.layout import nhwc_view_of_nchw
from gpushape.tracing.records import TensorMeta

from .cases import meta


def _meta(shape, strides) -> TensorMeta:
    return TensorMeta(shape, "bfloat16", strides, "strided", 2)


def test_an_nhwc_view_of_nchw_activations_is_known_by_its_strides():
    n, c, h, w = 2, 96, 8, 8
    assert nhwc_view_of_nchw(_meta((n, h, w, c), (c * h * w, w, 1, h * w)))
    assert not nhwc_view_of_nchw(_meta((n, h, w, c), (h * w * c, w * c, c, 1)))  # contiguous
    t = 49  # attention scores transposed over their last two dimensions: not activations
    assert not nhwc_view_of_nchw(_meta((n, 3, t, t), (3 * t * t, t * t, 1, t)))


class Stem(nn.Module):
    """ConvNeXt's stem: a 4x4 patch convolution, LayerNorm over its channels as NHWC."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 96, 4, stride=4)
        self.norm = nn.LayerNorm(96)

    def forward(self, x):
        return self.norm(self.conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _audit(memory_format):
    model = Stem().to(device="meta", dtype=torch.bfloat16).to(memory_format=memory_format)
    x = meta(16, 3, 224, 224).to(torch.bfloat16).contiguous(memory_format=memory_format)
    return audit(model, (x,), gpu=get_gpu("h200"), train=True, profile=None)


def test_the_saving_counts_the_stems_copies_and_matches_converting():
    before = _audit(torch.contiguous_format)
    (f,) = [f for f in before.findings if f.rule == "nchw-conv"]
    assert f.evidence["nhwc_view_copy_ops"] == 2  # the norm's input, forward and backward
    assert f.evidence["nhwc_view_copies_s"] > 0 and f.evidence["gradient_copies_s"] > 0
    assert f.est_saving_s == pytest.approx(
        f.evidence["conversions_s"] + f.evidence["gradient_copies_s"]
        + f.evidence["nchw_norm_pool_s"] + f.evidence["nhwc_view_copies_s"]
    )  # fmt: skip
    after = _audit(torch.channels_last)
    assert not [f for f in after.findings if f.rule == "nchw-conv"]
    saved = before.totals.kernel_time_s - after.totals.kernel_time_s
    assert f.est_saving_s == pytest.approx(saved, rel=0.05)


def test_a_stem_without_the_permute_copies_nothing():
    model = nn.Sequential(nn.Conv2d(3, 96, 4, stride=4), nn.GELU())
    model = model.to(device="meta", dtype=torch.bfloat16)
    x = meta(16, 3, 224, 224).to(torch.bfloat16)
    rep = audit(model, (x,), gpu=get_gpu("h200"), train=True, profile=None)
    (f,) = [f for f in rep.findings if f.rule == "nchw-conv"]
    assert f.evidence["nhwc_view_copies_s"] == 0 and f.evidence["gradient_copies_s"] == 0
