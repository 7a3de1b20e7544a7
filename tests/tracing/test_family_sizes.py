"""Families whose rate depends on a size of the op (tracing/families.py SIZE_BASE): NCHW
BatchNorm by its channels, LayerNorm by its row length, depthwise convolutions by their kernel
side, patch embeddings by their patch side. Each op is priced at the measured size nearest its
own; with nothing measured at any size it falls back to what it was priced at before."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, only, trace_fn
from torch import nn

import gpushape
from gpushape.hardware import get_gpu
from gpushape.tracing.cost import op_cost
from gpushape.tracing.families import (
    ALL_FAMILIES,
    SIZE_VARIANTS,
    memory_family,
    op_family,
    priced_family,
    variant_size,
)
from gpushape.tracing.gemm_model import gemm_efficiency, small_cin_rate


def _spec(**eff):
    """The H200 with these family efficiencies and no kernel floor: the tiny tensors here
    are priced by their bytes alone, the rates under test."""
    spec = get_gpu("h200")
    achievable = dataclasses.replace(spec.achievable, memory_efficiency=eff, kernel_floor_s=0.0)
    return spec.replace(achievable=achievable)


def _batch_norm(channels: int, channels_last: bool = False, name: str = "native_batch_norm"):
    x = meta(2, channels, 8, 8, dtype=torch.bfloat16)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    fn = lambda x: F.batch_norm(x, None, None, training=True)
    return only(trace_fn(fn, (x,), train=True), name)


BN_MEASURED = {
    "batch_norm": 0.43,
    "batch_norm_nchw": 0.24,
    "batch_norm_nchw@16": 0.03,
    "batch_norm_nchw@64": 0.08,
}


@pytest.mark.parametrize(
    ("channels", "priced"),
    [
        (16, "batch_norm_nchw@16"),
        (24, "batch_norm_nchw@16"),  # 24/16 < 64/24
        (40, "batch_norm_nchw@64"),
        (112, "batch_norm_nchw@64"),  # 112/64 < 256/112
        (200, "batch_norm_nchw"),  # the family's own figure, taken at 256 channels
        (960, "batch_norm_nchw"),
    ],
)
def test_nchw_batch_norm_is_priced_at_the_nearest_measured_channel_count(channels, priced):
    for name in ("native_batch_norm", "native_batch_norm_backward"):
        rec = _batch_norm(channels, name=name)
        assert variant_size(rec, memory_family(rec)) == channels
        assert op_family(rec, BN_MEASURED) == priced


def test_channels_last_batch_norm_ignores_the_nchw_channel_figures():
    assert op_family(_batch_norm(16, channels_last=True), BN_MEASURED) == "batch_norm"


def test_nchw_batch_norm_falls_back_as_before_when_no_channel_count_is_measured():
    rec = _batch_norm(16)
    assert op_family(rec, {"batch_norm": 0.4, "batch_norm_nchw": 0.24}) == "batch_norm_nchw"
    assert op_family(rec, {"batch_norm": 0.4}) == "batch_norm"  # profiles before the NCHW split
    assert op_family(rec, {}) == "batch_norm"  # nothing measured: memory() gives 1
    # only the channel figures measured: the nearest one, never the copy rate
    assert op_family(rec, {"batch_norm_nchw@64": 0.08}) == "batch_norm_nchw@64"


def test_a_sixteen_channel_figure_prices_the_op_at_it():
    rec = _batch_norm(16)
    base = op_cost(rec, _spec(batch_norm_nchw=0.24)).memory_s
    low = op_cost(rec, _spec(batch_norm_nchw=0.24, **{"batch_norm_nchw@16": 0.03})).memory_s
    assert low == pytest.approx(base * 0.24 / 0.03)


@pytest.mark.parametrize(
    ("row", "priced"),
    [(96, "norm@96"), (128, "norm@96"), (192, "norm@192"), (256, "norm@192"), (300, "norm@384")],
)
def test_short_layer_norm_rows_take_the_nearest_measured_row_length(row, priced):
    measured = {"norm": 0.43, "norm@96": 0.1, "norm@192": 0.15, "norm@384": 0.28, "norm@768": 0.36}
    rec = only(trace_fn(lambda x: F.layer_norm(x, (row,)), (meta(8, row),)), "native_layer_norm")
    assert op_family(rec, measured) == priced
    # a profile measured before the short rows: the shortest it has
    assert priced_family("norm", {"norm": 0.43, "norm@384": 0.28}, row) == "norm@384"


def _depthwise(kernel: int, channels_last: bool):
    x = torch.empty(2, 32, 16, 16, device="meta", dtype=torch.bfloat16)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    conv = nn.Conv2d(32, 32, kernel, padding=kernel // 2, groups=32, bias=False)
    trace = gpushape.trace(conv.to("meta", torch.bfloat16), (x,), train=True)
    return [r for r in trace.ops if "convolution" in r.op]


def test_nchw_depthwise_convolutions_have_their_family_priced_by_kernel_side():
    measured = {"grouped_conv": 0.07, "grouped_conv_nchw@3": 0.1, "grouped_conv_nchw@5": 0.04}
    for kernel, priced in ((3, "grouped_conv_nchw@3"), (5, "grouped_conv_nchw@5")):
        for rec in _depthwise(kernel, channels_last=False):
            assert memory_family(rec) == "grouped_conv_nchw"
            assert op_family(rec, measured) == priced
    for rec in _depthwise(7, channels_last=False):  # 7/5 < 7/3: the nearest NCHW figure
        assert op_family(rec, measured) == "grouped_conv_nchw@5"
    for rec in _depthwise(3, channels_last=True):
        assert op_family(rec, measured) == "grouped_conv"
    for rec in _depthwise(3, channels_last=False):  # unmeasured in NCHW: as before, grouped_conv
        assert op_family(rec, {"grouped_conv": 0.07}) == "grouped_conv"


def _conv_gemm(conv: nn.Conv2d):
    x = torch.empty(2, conv.in_channels, 64, 64, device="meta", dtype=torch.bfloat16)
    trace = gpushape.trace(conv.to("meta", torch.bfloat16), (x,), train=True)
    fwd = only(trace, "convolution")
    return fwd, gpushape.tracing.flops.registry.op_work(fwd).gemms[0]


@pytest.mark.parametrize(
    ("conv", "patch"),
    [
        (nn.Conv2d(3, 96, 4, stride=4), 4),  # ConvNeXt's and Swin's stem
        (nn.Conv2d(3, 64, 16, stride=16), 16),  # ViT's patch embedding
        (nn.Conv2d(3, 64, 7, stride=2, padding=3), 0),  # ResNet's stem: overlapping
        (nn.Conv2d(3, 64, 4, stride=4, padding=1), 0),
        (nn.Conv2d(3, 64, 1), 0),
        (nn.Conv2d(96, 192, 2, stride=2), 2),  # a downsample: a patch, but on aligned channels
    ],
)
def test_patch_embeddings_carry_their_patch_side(conv, patch):
    _, gemm = _conv_gemm(conv)
    assert gemm.patch == patch


def _stem_rates(**measured: float):
    """The H200 with its stride-2 stem's rate at 0.07 and only `measured` families."""
    spec = get_gpu("h200")
    rates = dataclasses.replace(spec.achievable, small_cin_conv=0.07, memory_efficiency=measured)
    return spec.replace(achievable=rates)


def test_a_patch_embedding_takes_the_measured_patch_rate_nearest_its_side():
    stem_only = _stem_rates()
    patches = _stem_rates(**{"patch_conv@4": 0.02, "patch_conv@16": 0.035})
    _, g4 = _conv_gemm(nn.Conv2d(3, 96, 4, stride=4))
    _, g16 = _conv_gemm(nn.Conv2d(3, 64, 16, stride=16))
    _, g8 = _conv_gemm(nn.Conv2d(3, 64, 8, stride=8))  # equally far from 4 and 16: the smaller
    _, stem = _conv_gemm(nn.Conv2d(3, 64, 7, stride=2, padding=3))
    assert small_cin_rate(g4, stem_only) == 0.07  # unmeasured: the 7x7 stem's rate, as before
    assert small_cin_rate(g4, patches) == 0.02
    assert small_cin_rate(g16, patches) == 0.035
    assert small_cin_rate(g8, patches) == 0.02
    assert small_cin_rate(stem, patches) == 0.07
    e_stem, e_patch = gemm_efficiency(g4, stem_only, "bf16"), gemm_efficiency(g4, patches, "bf16")
    assert e_patch.efficiency == pytest.approx(e_stem.efficiency * 0.02 / 0.07)


def test_a_stem_takes_the_rate_measured_at_the_stride_nearest_its_own():
    stem_only, strides = _stem_rates(), _stem_rates(**{"small_cin_conv@4": 0.025})
    _, s2 = _conv_gemm(nn.Conv2d(3, 64, 7, stride=2, padding=3))  # ResNet's
    _, s4 = _conv_gemm(nn.Conv2d(3, 64, 7, stride=4, padding=2))  # PoolFormer's
    _, s3 = _conv_gemm(nn.Conv2d(3, 64, 5, stride=3, padding=2))
    _, patch = _conv_gemm(nn.Conv2d(3, 96, 4, stride=4))
    assert (s2.stride, s4.stride, s3.stride, patch.stride) == (2, 4, 3, 0)
    assert small_cin_rate(s4, stem_only) == 0.07  # unmeasured: the stride-2 stem's, as before
    assert small_cin_rate(s4, strides) == 0.025
    assert small_cin_rate(s2, strides) == 0.07  # conv_small_cin is stride 2's
    assert small_cin_rate(s3, strides) == 0.025  # 4/3 is nearer than 3/2
    assert small_cin_rate(patch, strides) == 0.07  # a patch embedding: patch_conv@ or the stem
    e2, e4 = gemm_efficiency(s4, stem_only, "bf16"), gemm_efficiency(s4, strides, "bf16")
    assert e4.efficiency == pytest.approx(e2.efficiency * 0.025 / 0.07)


def test_every_size_variant_is_a_known_family():
    assert set(SIZE_VARIANTS) <= set(ALL_FAMILIES)
    assert {"patch_conv@4", "patch_conv@16", "gather", "scatter_add"} <= set(ALL_FAMILIES)


REDUCTION_MEASURED = {"reduction": 0.48, "reduction@768": 0.24, "reduction@3072": 0.58}


@pytest.mark.parametrize(
    ("fn", "shape", "name", "width", "priced"),
    [
        (lambda x: x.sum(0), (64, 768), "sum", 768, "reduction@768"),  # a bias gradient
        (lambda x: x.sum((0, 1)), (4, 16, 96), "sum", 96, "reduction@768"),  # nearest by ratio
        (lambda x: x.sum(0), (64, 1024), "sum", 1024, "reduction"),  # the family's own size
        (lambda x: x.sum(0), (64, 2304), "sum", 2304, "reduction@3072"),  # 3072/2304 < 2304/1024
        (lambda x: x.sum(-1), (64, 768), "sum", None, "reduction"),  # a row sum
        (lambda x: x.sum(1), (768, 768), "sum", None, "reduction"),  # a square one's too
        (lambda x: x.mean((1, 2)), (4, 7, 7, 768), "mean", None, "reduction"),  # a pooling head
        (lambda x: x.sum(), (64, 768), "sum", None, "reduction"),  # all of it
    ],
)
def test_a_column_sum_is_priced_by_its_width(fn, shape, name, width, priced):
    rec = only(trace_fn(fn, (meta(*shape, dtype=torch.bfloat16),)), name)
    assert memory_family(rec) == "reduction"
    assert variant_size(rec, "reduction") == width
    assert op_family(rec, REDUCTION_MEASURED) == priced
    narrow, flat = _spec(**REDUCTION_MEASURED), _spec(reduction=0.48)
    ratio = op_cost(rec, narrow).memory_s / op_cost(rec, flat).memory_s
    assert ratio == pytest.approx(0.48 / REDUCTION_MEASURED[priced])
