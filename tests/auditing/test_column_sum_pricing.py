"""A Linear's bias gradient (a column sum) is priced eager at the rate measured for its width
(tracing/families.py "reduction@<width>") and under torch.compile at no worse than the
reduction family's own rate, which Inductor's reductions reach (pricing/column_sum.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gpushape
from gpushape.auditing import inductor as modes  # where compile mode prices them
from gpushape.hardware import calibrated


def _mlp() -> tuple[nn.Module, tuple]:
    model = nn.Sequential(nn.Linear(768, 768), nn.GELU(), nn.Linear(768, 3072))
    return model, (torch.empty(16384, 768, device="meta"),)


def _column_sums(spec):
    model, inputs = _mlp()
    traced = gpushape.trace(model.to(torch.bfloat16), (inputs[0].bfloat16(),), train=True)
    report = gpushape.cost(traced, spec, math="bf16")
    sums = [(r, report.ops[r.index]) for r in traced.ops if r.name == "sum"]
    assert len(sums) == 2  # the two biases' gradients
    return sorted(sums, key=lambda pair: pair[0].inputs[0].shape[-1])  # 768 wide, then 3072


def test_the_shipped_h200_profile_prices_a_768_wide_bias_gradient_below_the_family_rate():
    spec = calibrated("h200")
    measured = spec.achievable.memory_efficiency
    assert measured["reduction@768"] < measured["reduction"] < measured["reduction@3072"]
    (narrow_rec, narrow), (wide_rec, wide) = _column_sums(spec)
    bytes_time = lambda rec: rec.inputs[0].numel * 2 / spec.attainable_bandwidth_bytes_per_s()
    assert narrow.kernel_time_s > bytes_time(narrow_rec) / measured["reduction"]
    assert wide.kernel_time_s < bytes_time(wide_rec) / measured["reduction"] * 1.01


def test_under_compile_the_narrow_column_sums_cost_only_the_family_rate(monkeypatch):
    spec = calibrated("h200")
    model, inputs = _mlp()
    compiled = gpushape.audit(model, inputs, gpu="h200", dtype=torch.bfloat16, mode="compile")
    monkeypatch.setattr(modes, "compiled_column_sum_saving_s", lambda ctx: 0.0)
    eager_sums = gpushape.audit(model, inputs, gpu="h200", dtype=torch.bfloat16, mode="compile")
    measured = spec.achievable.memory_efficiency
    (_, narrow), _ = _column_sums(spec)  # only the 768-wide sum is priced below the family
    extra = narrow.kernel_time_s * (1 - measured["reduction@768"] / measured["reduction"])
    assert extra > 0
    assert eager_sums.step.gpu_s - compiled.step.gpu_s == pytest.approx(extra, rel=0.02)
