"""Depthwise and narrow grouped convolutions are direct, memory-bound kernels: no GEMM tiles,
their own memory family, and no tensor-core or wave-quantization advice."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gpushape
from gpushape.hardware import get_gpu
from gpushape.tracing.families import GROUPED_CONV, memory_family


def _cost(groups: int, cin: int = 384):
    x = torch.empty(64, cin, 28, 28, device="meta", dtype=torch.bfloat16)
    conv = nn.Conv2d(cin, cin, 7, padding=3, groups=groups, bias=False).to("meta", torch.bfloat16)
    trace = gpushape.trace(conv, (x.contiguous(memory_format=torch.channels_last),), train=True)
    return trace, gpushape.cost(trace, "h200")


def test_depthwise_is_memory_bound_at_its_familys_rate():
    trace, report = _cost(groups=384)
    convs = [o for o in report.ops if "convolution" in o.op]
    assert len(convs) == 2 and all(o.bound == "memory" and not o.gemms for o in convs)
    assert all(memory_family(r) == GROUPED_CONV for r in trace.ops if "convolution" in r.op)
    spec = get_gpu("h200")
    fwd = convs[0]
    assert fwd.kernel_time_s == fwd.memory_s  # bytes at the copy rate (family unmeasured here)
    assert fwd.memory_s * spec.attainable_bandwidth_bytes_per_s() == fwd.min_bytes


def test_a_measured_family_rate_prices_them():
    spec = get_gpu("h200")
    slow = spec.replace(
        achievable=spec.achievable.__class__(
            **{**spec.achievable.__dict__, "memory_efficiency": {GROUPED_CONV: 0.25}}
        )
    )
    trace, fast = _cost(groups=384)
    priced = gpushape.cost(trace, slow)
    assert priced.totals.kernel_time_s > 3.5 * fast.totals.kernel_time_s


def test_groups_of_eight_channels_stay_gemms():
    trace, report = _cost(groups=48)  # 8 input channels per group
    convs = [o for o in report.ops if "convolution" in o.op]
    assert all(o.gemms for o in convs)
    assert all(memory_family(r) is None for r in trace.ops if "convolution" in r.op)


def test_no_wave_quantization_or_alignment_advice_on_depthwise():
    x = torch.empty(64, 384, 28, 28, device="meta", dtype=torch.bfloat16)
    conv = nn.Conv2d(384, 384, 7, padding=3, groups=384).to("meta", torch.bfloat16)
    report = gpushape.audit(conv, (x,), "h200", train=True)
    assert not {f.rule for f in report.findings} & {"wave-quantization", "tc-align"}


def test_a_convolutions_bias_gradient_is_a_column_sum_priced_at_its_width():
    """grad_output.sum over batch and positions is a kernel of its own that reads grad_output
    once more: channels_last, a column sum over the output channels, priced as a Linear's
    bias gradient at the reduction figure measured nearest its width; no bias, no pass."""
    import dataclasses

    spec = get_gpu("h200")
    measured = {"grouped_conv": 0.1, "reduction@768": 0.25}
    spec = spec.replace(achievable=dataclasses.replace(spec.achievable, memory_efficiency=measured))

    def backward(bias: bool):
        x = torch.empty(64, 96, 56, 56, device="meta", dtype=torch.bfloat16)
        conv = nn.Conv2d(96, 96, 7, padding=3, groups=96, bias=bias).to("meta", torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last)
        trace = gpushape.trace(conv, (x,), train=True)
        (op,) = [o for o in gpushape.cost(trace, spec).ops if "convolution_backward" in o.op]
        return op

    with_bias, without = backward(True), backward(False)
    grad_out_bytes = 64 * 96 * 56 * 56 * 2
    extra = grad_out_bytes / (spec.attainable_bandwidth_bytes_per_s() * 0.25)
    assert with_bias.weight_grad_s == pytest.approx(extra) and without.weight_grad_s == 0
    assert with_bias.kernel_time_s == pytest.approx(without.kernel_time_s + extra, rel=1e-3)
