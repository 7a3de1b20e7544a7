"""What graph-layers' GEMV bias gradients take off the GPU (steps/graph_layers_gemv.py): each
qualifying Linear's column sum inside a captured layer, priced again at the profile's GEMV
figure nearest its shape; nothing where the profile has none."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from gpushape.auditing.target import resolve_target
from gpushape.steps.graph_layers_gemv import gemv_saving_s
from gpushape.tracing.cost import cost
from gpushape.tracing.sums import sum_shape
from gpushape.tracing.tracer import trace


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(2)
        )
        self.head = nn.Linear(64, 8)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _with(memory: dict):
    spec = resolve_target("h200").spec
    effs = {k: v for k, v in spec.achievable.memory_efficiency.items() if "gemv" not in k}
    achievable = dataclasses.replace(spec.achievable, memory_efficiency={**effs, **memory})
    return spec.replace(achievable=achievable)


def _traced(dtype=torch.bfloat16, rows=4096):
    model = _Stack().to(dtype)
    x = torch.empty(rows, 64, dtype=dtype, device="meta")
    return trace(model.to("meta"), (x,), train=True)


def test_each_captured_linears_bias_gradient_is_priced_at_the_gemv_figure():
    gpu = _with({"gemv_column_sum@4096x256": 0.8, "gemv_column_sum@4096x64": 0.6})
    traced = _traced()
    costed = cost(traced, gpu)
    sums = [r for r in traced.ops if r.module_type == "Linear" and sum_shape(r)]
    inside = [r for r in sums if r.module.startswith("blocks.0.")]
    assert {r.module for r in inside} == {"blocks.0.0", "blocks.0.2"}
    bandwidth, floor = gpu.attainable_bandwidth_bytes_per_s(), gpu.achievable.kernel_floor_s
    eff = {256: 0.8, 64: 0.6}
    expected = sum(
        costed.ops[r.index].kernel_time_s
        - max(r.inputs[0].nbytes / (bandwidth * eff[sum_shape(r)[2]]), floor)
        for r in inside
    )
    assert expected > 0
    assert gemv_saving_s(traced, costed, gpu, ["blocks.0"]) == pytest.approx(expected)
    both = gemv_saving_s(traced, costed, gpu, ["blocks.0", "blocks.1"])
    assert both == pytest.approx(2 * expected)  # the head is not captured


def test_nothing_without_a_gemv_figure_a_float32_model_or_too_few_rows():
    gpu = _with({"gemv_column_sum@4096x256": 0.8})
    bare = _with({})
    traced = _traced()
    assert gemv_saving_s(traced, cost(traced, bare), bare, ["blocks.0"]) == 0.0
    fp32 = _traced(torch.float32)
    assert gemv_saving_s(fp32, cost(fp32, gpu), gpu, ["blocks.0"]) == 0.0
    few = _traced(rows=512)  # under MIN_ROWS: graph-layers keeps PyTorch's reduction
    assert gemv_saving_s(few, cost(few, gpu), gpu, ["blocks.0"]) == 0.0


def test_fuse_qkvs_fused_projection_takes_the_gemv_too():
    from gpushape.transforms._fused_linear import FusedLinear

    weight, bias = (
        torch.zeros(192, 64, dtype=torch.bfloat16),
        torch.zeros(192, dtype=torch.bfloat16),
    )
    fused = FusedLinear(weight, bias, ("q", "k", "v"), (64, 64, 64))
    model = nn.Sequential(nn.Sequential(fused)).to("meta")
    x = torch.empty(4096, 64, dtype=torch.bfloat16, device="meta")
    traced = trace(model, (x,), train=True)
    sums = [r for r in traced.ops if r.module_type == "FusedLinear" and sum_shape(r)]
    assert [sum_shape(r) for r in sums] == [("reduction", 4096, 192)]
    gpu = _with({"gemv_column_sum@4096x192": 0.8})
    assert gemv_saving_s(traced, cost(traced, gpu), gpu, ["0"]) > 0
