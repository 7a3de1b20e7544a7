"""s2d-stem's convolution is priced at the rate the probe measured for it ("s2d_stem" by folded
kernel side), the GEMM model's rate where none is; its input's fold as memory family
"s2d_fold"; the probe's workload times the folded convolution against the GEMM model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from gpushape.hardware import get_gpu
from gpushape.hardware.profile import calibrated
from gpushape.models.space_to_depth import SpaceToDepthConv2d
from gpushape.probe import memory as probe_memory
from gpushape.tracing.families import memory_family
from gpushape.tracing.flops.conv import S2D_FOLD, S2D_STEM
from gpushape.tracing.flops.registry import op_work
from gpushape.tracing.gemm_model import gemm_efficiency
from gpushape.tracing.inputs import TensorSpec
from gpushape.tracing.tracer import trace

X = TensorSpec((8, 3, 64, 64), torch.bfloat16, channels_last=True)


def _gemms(module: nn.Module):
    ops = trace(module.to(torch.bfloat16), (X,), train=True).ops
    return ops, [g for r in ops if "convolution" in r.name for g in op_work(r).gemms]


def test_the_folded_convolution_takes_the_measured_rate():
    stem = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
    ops, gemms = _gemms(SpaceToDepthConv2d(stem))
    assert len(gemms) == 2 and all(g.rate_key == f"{S2D_STEM}@4" for g in gemms)  # fwd, wgrad
    assert all(dict(g.align_dims)["Cin/groups"] == 16 for g in gemms)
    folds = [r for r in ops if r.module_type == "SpaceToDepthFold"]
    assert [r.name for r in folds] == ["constant_pad_nd", "pixel_unshuffle", "constant_pad_nd"]
    assert {memory_family(r) for r in folds} == {S2D_FOLD}  # the input's fold, by its module
    gpu = calibrated("h200")
    measured = {**gpu.achievable.memory_efficiency, S2D_STEM: 0.2}
    rated = gpu.replace(achievable=dataclasses.replace(gpu.achievable, memory_efficiency=measured))
    unmeasured = {k: v for k, v in measured.items() if k != S2D_STEM}
    bare = gpu.replace(achievable=dataclasses.replace(gpu.achievable, memory_efficiency=unmeasured))
    for g in gemms:
        plain = gemm_efficiency(g, bare, "bf16")
        assert plain.kernel_rate == 1.0
        assert gemm_efficiency(g, rated, "bf16").efficiency == pytest.approx(plain.efficiency * 0.2)
    _, plain_gemms = _gemms(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False))
    assert plain_gemms and not any(g.rate_key for g in plain_gemms)


@pytest.mark.parametrize("family", [S2D_STEM, f"{S2D_STEM}@2"])
def test_the_probe_times_the_folded_convolution_against_the_gemm_model(family):
    row = probe_memory.measure_memory_efficiency(
        get_gpu("h200"), device="cpu", scale=0.002, families=(family,)
    )[family]
    assert row["model_s"] > 0 and row["measured_s"] > 0
    assert row["module_measured_s"] > 0 and row["stem_measured_s"] > 0
    raw = row["model_s"] / row["measured_s"]
    assert row["efficiency"] == pytest.approx(min(max(raw, 0.01), 1.0), abs=1e-4)


def test_a_3x3_stem_takes_the_rate_measured_nearest_its_folded_side():
    """A 3x3/2 stem folds to a 2x2 kernel: "s2d_stem@2" where measured, else the 4x4's."""
    _, gemms = _gemms(SpaceToDepthConv2d(nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False)))
    assert {g.rate_key for g in gemms} == {f"{S2D_STEM}@2"}
    gpu = calibrated("h200")

    def rate(measured):
        spec = gpu.replace(
            achievable=dataclasses.replace(gpu.achievable, memory_efficiency=measured)
        )
        return gemm_efficiency(gemms[0], spec, "bf16").kernel_rate

    assert rate({S2D_STEM: 0.2, f"{S2D_STEM}@2": 0.1}) == 0.1
    assert rate({S2D_STEM: 0.2}) == 0.2
    assert rate({}) == 1.0


def test_the_rule_is_info_until_both_rates_are_measured_and_quiet_on_a_3x3_stem():
    """slow-stem prices the fold and the folded convolution at measured rates only: with the
    convolution's rate alone it says nothing it cannot back; with both, ResNet's 7x7/2 stem
    saves and a 3x3/2 stem (whose fold costs what its convolution gains) stays quiet."""
    from gpushape import audit

    gpu = calibrated("h200")

    def findings(kernel, measured):
        spec = gpu.replace(
            achievable=dataclasses.replace(
                gpu.achievable, memory_efficiency={**gpu.achievable.memory_efficiency, **measured}
            )
        )
        model = nn.Sequential(nn.Conv2d(3, 32, kernel, 2, kernel // 2, bias=False), nn.ReLU())
        model = model.to(torch.bfloat16, memory_format=torch.channels_last)
        x = TensorSpec((256, 3, 224, 224), torch.bfloat16, channels_last=True)
        report = audit(model, (x,), gpu=spec, train=True, rules=["slow-stem"])
        return [f for f in report.findings if f.rule == "slow-stem"]

    rates = {S2D_STEM: 0.148, f"{S2D_STEM}@2": 0.155, S2D_FOLD: 0.212}  # an H100's
    (info,) = findings(7, {S2D_STEM: 0.148})
    assert info.est_saving_s is None and "has not measured the fold" in info.message
    (found,) = findings(7, rates)
    assert found.est_saving_s > 0 and found.fix == "s2d-stem"
    assert findings(3, rates) == []


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_trace_keeps_the_models_layout_past_the_stem(channels_last):
    """The meta trace sees what runs: downstream of the folded stem an NCHW model stays NCHW
    (the cost model prices NCHW convolutions with their conversions), a channels_last one
    channels_last."""
    stem = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
    model = nn.Sequential(SpaceToDepthConv2d(stem), nn.BatchNorm2d(64)).to(torch.bfloat16)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    x = TensorSpec((8, 3, 64, 64), torch.bfloat16, channels_last=channels_last)
    ops = trace(model, (x,), train=True).ops
    norm = next(r for r in ops if "batch_norm" in r.name and r.phase == "forward")
    want = "channels_last" if channels_last else "contiguous"
    assert norm.inputs[0].memory_format == want


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_the_rule_leaves_a_stem_padded_otherwise_than_with_zeros(mode):
    """s2d-stem refuses a padding_mode other than zeros; the rule, which sees the padding as ops
    of the module before its convolution, says nothing there either."""
    from gpushape import audit

    gpu = calibrated("h200")
    measured = {**gpu.achievable.memory_efficiency, S2D_STEM: 0.148, S2D_FOLD: 0.212}
    spec = gpu.replace(achievable=dataclasses.replace(gpu.achievable, memory_efficiency=measured))
    x = TensorSpec((256, 3, 224, 224), torch.bfloat16, channels_last=True)

    def found(padding_mode):
        conv = nn.Conv2d(3, 64, 7, 2, 3, bias=False, padding_mode=padding_mode)
        model = conv.to(torch.bfloat16, memory_format=torch.channels_last)
        report = audit(model, (x,), gpu=spec, train=True, rules=["slow-stem"])
        return [f for f in report.findings if f.rule == "slow-stem"]

    assert found("zeros") and not found(mode)
