"""s2d-stem's convolution is priced at the rate the probe measured for it ("s2d_stem"), the
GEMM model's rate where none is; its folds are priced as copies; the probe's workload for it
times the folded convolution against the GEMM model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from gpushape.hardware import get_gpu
from gpushape.hardware.profile import calibrated
from gpushape.probe import memory as probe_memory
from gpushape.tracing.flops.conv import S2D_STEM
from gpushape.tracing.flops.registry import op_work
from gpushape.tracing.gemm_model import gemm_efficiency
from gpushape.tracing.inputs import TensorSpec
from gpushape.tracing.tracer import trace
from gpushape.transforms._s2d import SpaceToDepthConv2d

X = TensorSpec((8, 3, 64, 64), torch.bfloat16, channels_last=True)


def _gemms(module: nn.Module):
    ops = trace(module.to(torch.bfloat16), (X,), train=True).ops
    return ops, [g for r in ops if "convolution" in r.name for g in op_work(r).gemms]


def test_the_folded_convolution_takes_the_measured_rate():
    stem = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
    ops, gemms = _gemms(SpaceToDepthConv2d(stem))
    assert len(gemms) == 2 and all(g.rate_key == S2D_STEM for g in gemms)  # forward, wgrad
    assert all(dict(g.align_dims)["Cin/groups"] == 16 for g in gemms)
    names = [r.name for r in ops if r.phase == "forward"]
    assert names.count("pixel_unshuffle") == 1 and "constant_pad_nd" in names
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


def test_the_probe_times_the_folded_convolution_against_the_gemm_model():
    row = probe_memory.measure_memory_efficiency(
        get_gpu("h200"), device="cpu", scale=0.002, families=(S2D_STEM,)
    )[S2D_STEM]
    assert row["model_s"] > 0 and row["measured_s"] > 0
    assert row["module_measured_s"] > 0 and row["stem_measured_s"] > 0
    raw = row["model_s"] / row["measured_s"]
    assert row["efficiency"] == pytest.approx(min(max(raw, 0.01), 1.0), abs=1e-4)
