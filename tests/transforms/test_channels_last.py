"""channels-last: weights and inputs restrided, values and parameter objects unchanged,
reversible, idempotent; the audit no longer raises nchw-conv."""

from __future__ import annotations

import torch

from gpushape.transforms import optimize, revert

from .nets import ConvNet

CL = torch.channels_last


def _convs(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]


def test_weights_and_inputs_channels_last_and_the_function_unchanged():
    torch.manual_seed(0)
    model = ConvNet()
    params = dict(model.named_parameters())
    x = torch.randn(2, 3, 8, 8)
    seen = []
    model.stem.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model, report = optimize(model, (x,), dtype=torch.float32, transforms=["channels-last"])
    assert report.verified["channels-last"].passed
    assert all(c.weight.is_contiguous(memory_format=CL) for c in _convs(model))
    assert dict(model.named_parameters()) == params
    seen.clear()
    model(x)
    assert seen[0].is_contiguous(memory_format=CL) and not seen[0].is_contiguous()


def test_audit_no_longer_raises_nchw_conv():
    model = ConvNet()
    x = torch.randn(8, 3, 32, 32)
    _, report = optimize(model, (x,), gpu="h200", dtype=torch.float32, transforms=["channels-last"])
    assert any(f.rule == "nchw-conv" for f in report.before.findings)
    assert not any(f.rule == "nchw-conv" for f in report.after.findings)


def test_revert_and_twice_equals_once():
    model = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    model, first = optimize(model, (x,), dtype=torch.float32, transforms=["channels-last"])
    model, second = optimize(model, (x,), dtype=torch.float32, transforms=["channels-last"])
    assert first.applied and not second.applied
    model = revert(model)
    assert not model._forward_pre_hooks
    big = [c.weight for c in _convs(model) if c.kernel_size != (1, 1)]
    assert all(w.is_contiguous() and not w.is_contiguous(memory_format=CL) for w in big)


def test_a_1x1_weight_contiguous_both_ways_gets_channels_last_strides_and_reverts():
    """(C_out, C_in, 1, 1) with strides (C_in, 1, 1, 1) passes is_contiguous in both formats;
    PyTorch runs such a convolution NCHW, so the weight is restrided, and revert puts the
    original strides back exactly."""
    from torch import nn

    from gpushape.transforms import TransformContext, get_transform
    from gpushape.transforms._core import remember

    model = nn.Sequential(nn.Conv2d(16, 8, 1))
    weight = model[0].weight
    assert weight.stride() == (16, 1, 1, 1)
    assert weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 1, 1)
    expected = model(x)
    ctx = TransformContext(example_inputs=(x,))
    outcome = get_transform("channels-last").apply(model, ctx)
    remember(model, outcome.changes)
    assert model[0].weight is weight and weight.stride() == (16, 1, 16, 16)
    torch.testing.assert_close(model(x), expected)  # the channels_last kernel now runs
    revert(model)
    assert weight.stride() == (16, 1, 1, 1)
