"""NCHW tensor-core convolutions (trace/layout.py): which records convert, how many bytes, and
how the cost model adds their time to the convolution's."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, only, trace_fn

from gpushape.hardware import get_gpu
from gpushape.tracing.cost import op_cost
from gpushape.tracing.flops.conv import embedding_side, stem_stride
from gpushape.tracing.layout import (
    conversion_bytes_of,
    conversion_family,
    conversion_passes,
    nchw_conversion_bytes,
)

BF16 = torch.bfloat16
X, W = (8, 64, 28, 28), (32, 64, 3, 3)  # bf16: x 802,816 bytes, y 401,408


def _conv_trace(channels_last: bool, *, weight_grad: bool = True, input_grad: bool = True):
    x = meta(*X, dtype=BF16, requires_grad=input_grad)
    w = torch.empty(W, dtype=BF16, device="meta")
    if channels_last:
        x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_(input_grad)
        w = w.contiguous(memory_format=torch.channels_last)
    fn = (
        (lambda x, w: F.conv2d(x, w, padding=1))
        if weight_grad
        else (lambda x: F.conv2d(x, w, padding=1))
    )
    return trace_fn(fn, (x,), (w,) if weight_grad else (), train=True)


def test_an_nchw_convolution_converts_in_each_pass_it_runs():
    t = _conv_trace(False)
    fwd, bwd = only(t, "convolution"), only(t, "convolution_backward")
    x, y = 8 * 64 * 28 * 28 * 2, 8 * 32 * 28 * 28 * 2
    assert conversion_passes(fwd) == 1 and conversion_bytes_of(fwd) == 2 * (x + y)
    assert conversion_passes(bwd) == 2 and conversion_bytes_of(bwd) == 4 * (x + y)
    assert conversion_bytes_of(fwd) + conversion_bytes_of(bwd) == nchw_conversion_bytes(
        x, y, grad_input=True, grad_weight=True
    )


def test_only_the_gradients_computed_convert():
    bwd = only(_conv_trace(False, weight_grad=False), "convolution_backward")
    assert conversion_passes(bwd) == 1  # grad_input only: the weight is a constant


def test_channels_last_converts_nothing():
    t = _conv_trace(True)
    assert not any(conversion_passes(r) for r in t.ops)
    assert conversion_bytes_of(only(t, "convolution")) == 0


def test_the_cost_model_adds_the_conversions_at_the_measured_efficiency():
    fwd = only(_conv_trace(False), "convolution")
    spec = get_gpu("h200")  # no kernel floor: the conversions' bytes alone (a tiny conv)
    spec = spec.replace(achievable=dataclasses.replace(spec.achievable, kernel_floor_s=0.0))
    c = op_cost(fwd, spec)
    assert c.tensor_cores and c.layout_s == pytest.approx(
        conversion_bytes_of(fwd) / spec.attainable_bandwidth_bytes_per_s()
    )
    assert c.kernel_time_s == pytest.approx(max(c.compute_s, c.memory_s) + c.layout_s)
    slow = spec.replace(
        achievable=dataclasses.replace(spec.achievable, memory_efficiency={"nchw_conversion": 0.5})
    )
    assert op_cost(fwd, slow).layout_s == pytest.approx(2 * c.layout_s)
    assert op_cost(fwd, spec).kernels == 1 + 2  # the GEMM and its two conversions
    cl = op_cost(only(_conv_trace(True), "convolution"), spec)
    assert cl.layout_s == 0 and cl.kernels == 1


def test_no_conversion_off_tensor_cores():
    fwd = only(_conv_trace(False), "convolution")
    c = op_cost(fwd, get_gpu("v100"), math="fp32")  # fp32 on CUDA cores: cuDNN stays NCHW
    assert not c.tensor_cores and c.layout_s == 0


def _patch_trace(cin: int, side: int, stride: int | None = None, groups: int = 1):
    x = meta(2, cin, 32, 32, dtype=BF16)
    w = torch.empty(16 * groups, cin // groups, side, side, dtype=BF16, device="meta")
    return trace_fn(
        lambda x, w: F.conv2d(x, w, stride=stride or side, groups=groups), (x,), (w,), train=True
    )


def _specs(measured):
    """The H200 with `measured` as its memory efficiencies (no kernel floor), and with none."""
    spec = get_gpu("h200")
    achievable = dataclasses.replace(
        spec.achievable, kernel_floor_s=0.0, memory_efficiency=measured
    )
    flat = dataclasses.replace(achievable, memory_efficiency={})
    return spec.replace(achievable=achievable), spec.replace(achievable=flat)


@pytest.mark.parametrize("pass_", ["convolution", "convolution_backward"])
def test_a_patch_embedding_of_an_image_is_known_by_its_side_in_both_passes(pass_):
    assert embedding_side(only(_patch_trace(3, 16), pass_)) == 16
    assert embedding_side(only(_patch_trace(3, 4), pass_)) == 4
    assert embedding_side(only(_patch_trace(64, 2), pass_)) == 0  # aligned: a downsampling
    assert embedding_side(only(_patch_trace(3, 7, stride=2), pass_)) == 0  # a stem, overlapping


def test_a_patch_embedding_converts_at_the_rate_measured_for_the_nearest_side():
    measured = {"nchw_conversion": 1.0, "nchw_conversion@4": 0.6, "nchw_conversion@16": 0.2}
    fwd = only(_patch_trace(3, 16), "convolution")
    assert conversion_family(fwd, measured) == "nchw_conversion@16"
    assert conversion_family(only(_patch_trace(3, 8), "convolution"), measured).endswith("@4")
    assert conversion_family(only(_patch_trace(3, 14), "convolution"), measured).endswith("@16")
    assert conversion_family(fwd, {"nchw_conversion": 1.0}) == "nchw_conversion"
    assert conversion_family(only(_conv_trace(False), "convolution"), measured) == (
        "nchw_conversion"  # a bottleneck's conversions keep the generic rate
    )
    spec, flat = _specs(measured)
    assert op_cost(fwd, spec).layout_s == pytest.approx(op_cost(fwd, flat).layout_s / 0.2)


@pytest.mark.parametrize("pass_", ["convolution", "convolution_backward"])
def test_a_stem_on_an_image_is_known_by_its_stride_in_both_passes(pass_):
    assert stem_stride(only(_patch_trace(3, 7, stride=2), pass_)) == 2  # ResNet's
    assert stem_stride(only(_patch_trace(3, 7, stride=4), pass_)) == 4  # PoolFormer's
    assert stem_stride(only(_patch_trace(3, 16), pass_)) == 0  # a patch embedding
    assert stem_stride(only(_patch_trace(64, 3, stride=2), pass_)) == 0  # aligned channels
    assert stem_stride(only(_patch_trace(4, 3, stride=2, groups=2), pass_)) == 0  # grouped


def test_a_stem_converts_at_the_rate_measured_for_the_nearest_stride():
    measured = {
        "nchw_conversion": 1.0,
        "nchw_conversion@16": 0.2,
        "nchw_conversion_stem": 0.4,
        "nchw_conversion_stem@4": 0.3,
    }
    resnet = only(_patch_trace(3, 7, stride=2), "convolution")
    poolformer = only(_patch_trace(3, 7, stride=4), "convolution_backward")
    assert conversion_family(resnet, measured) == "nchw_conversion_stem"
    assert conversion_family(poolformer, measured) == "nchw_conversion_stem@4"
    assert conversion_family(only(_patch_trace(3, 3, stride=8), "convolution"), measured) == (
        "nchw_conversion_stem@4"
    )
    only_four = {"nchw_conversion": 1.0, "nchw_conversion_stem@4": 0.3}  # the nearest measured
    assert conversion_family(resnet, only_four) == "nchw_conversion_stem@4"
    assert conversion_family(resnet, {"nchw_conversion": 1.0}) == "nchw_conversion"
    assert conversion_family(only(_patch_trace(3, 16), "convolution"), measured) == (
        "nchw_conversion@16"  # a patch embedding keeps its own
    )
    spec, flat = _specs(measured)
    assert op_cost(resnet, spec).layout_s == pytest.approx(op_cost(resnet, flat).layout_s / 0.4)


@pytest.mark.parametrize(("kernel", "stride"), [(7, 2), (7, 4), (3, 2)])
def test_s2d_stems_folded_convolution_converts_as_the_stem_it_computes(kernel, stride):
    """Its stride is read back from the folded channels (an RGB image's 3 x s², aligned up)."""
    import gpushape
    from gpushape.models.space_to_depth import SpaceToDepthConv2d

    with torch.device("meta"):
        stem = torch.nn.Conv2d(3, 64, kernel, stride=stride, padding=kernel // 2, bias=False)
    module = SpaceToDepthConv2d(stem).to(BF16)
    trace = gpushape.trace(module, (meta(2, 3, 32, 32, dtype=BF16),), train=True)
    convs = [r for r in trace.ops if r.name in ("convolution", "convolution_backward")]
    assert convs and all(r.module_type == "SpaceToDepthConv2d" for r in convs)
    assert {stem_stride(r) for r in convs} == {stride}
    measured = {
        "nchw_conversion": 1.0,
        "nchw_conversion_stem": 0.46,
        "nchw_conversion_stem@4": 0.29,
    }
    want = "nchw_conversion_stem@4" if stride == 4 else "nchw_conversion_stem"
    assert {conversion_family(r, measured) for r in convs} == {want}


def test_a_convolutions_gradients_take_cudnns_layout_of_input_and_weight():
    """CUDA writes a convolution's input and weight gradients in the memory format cuDNN picks
    from the input and the weight, whatever the incoming gradient's: torch 2.11's meta kernel
    took the input gradient's from the incoming one, which a global average pool's backward
    hands over contiguous, and so traced a channels_last convnet's whole backward NCHW."""
    from gpushape.tracing.routing import cuda_output_layout

    func = torch.ops.aten.convolution_backward.default
    x = meta(*X, dtype=BF16).contiguous(memory_format=torch.channels_last)
    w = torch.empty(W, dtype=BF16, device="meta").contiguous(memory_format=torch.channels_last)
    dy = meta(8, 32, 28, 28, dtype=BF16)  # contiguous, as a pool's backward gives it
    nchw = (meta(*X, dtype=BF16), torch.empty(W, dtype=BF16, device="meta"), None)
    dx, dw, db = cuda_output_layout(func, (dy, x, w), nchw)
    assert dx.is_contiguous(memory_format=torch.channels_last) and dx.shape == X
    assert dw.is_contiguous(memory_format=torch.channels_last) and db is None
    plain = (dy, meta(*X, dtype=BF16), torch.empty(W, dtype=BF16, device="meta"))
    assert cuda_output_layout(func, plain, nchw)[0] is nchw[0]  # NCHW stays NCHW
    nhwc_dy = (dy.contiguous(memory_format=torch.channels_last), *plain[1:])
    meta_nhwc = (x, w, None)  # as a meta kernel following the incoming gradient gives them
    dx, dw, _ = cuda_output_layout(func, nhwc_dy, meta_nhwc)
    assert dx.is_contiguous() and dw.is_contiguous()  # cuDNN: from NCHW input and weight


def test_a_channels_last_convnet_is_traced_channels_last_below_its_pooled_head():
    """The gradient a global average pool hands back is contiguous; the convolution under it
    writes its input gradient channels_last, as cuDNN does (on torch 2.11 too). A 1x1
    weight (EfficientNet's head) suggests no layout: the input's decides."""
    x = meta(*X, dtype=BF16).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    w = torch.empty(32, 64, 1, 1, dtype=BF16, device="meta")
    t = trace_fn(lambda x, w: F.conv2d(x, w).mean((2, 3)), (x,), (w,), train=True)
    bwd = only(t, "convolution_backward")
    assert bwd.inputs[0].memory_format == "contiguous"  # the pool's gradient
    assert bwd.outputs[0].memory_format == "channels_last"
