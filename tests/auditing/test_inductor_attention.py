"""Grouped-query attention as a compiled step runs it (auditing/pricing/inductor_attention.py):
over K and V expanded to the query's heads, at the rate of SDPA's own pick for that call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gpushape
from gpushape.auditing.context import AuditContext
from gpushape.auditing.pricing.inductor_attention import (
    compiled_flash_s,
    compiled_gqa_saving_s,
    grouped,
)
from gpushape.hardware import get_gpu
from gpushape.hardware.profile import apply_profile

B, HQ, T, D = 2, 8, 256, 64


class Attention(nn.Module):
    def __init__(self, kv_heads: int):
        super().__init__()
        self.kv = kv_heads
        self.proj = nn.Linear(D, D)

    def forward(self, q):
        q = self.proj(q)  # (B, HQ, T, D)
        k = v = q[:, : self.kv]
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.kv != HQ
        ).sum()


def _gpu(gqa_rate: float, plain_rate: float):
    rows = {
        "default/causal/d64": {"default/fwd/causal/d64": plain_rate,
                               "default/bwd/causal/d64": plain_rate},
        "default/causal/gqa/d64": {"default/fwd/causal/gqa/d64": gqa_rate,
                                   "default/bwd/causal/gqa/d64": gqa_rate},
    }  # fmt: skip
    profile = {"format": "gpushape-profile", "version": 1, "gpu": "h200-sxm", "attention": rows}
    return apply_profile(get_gpu("h200-sxm"), profile)


def _ctx(kv_heads: int, gpu) -> AuditContext:
    model = Attention(kv_heads).to(device="meta", dtype=torch.bfloat16)
    x = torch.empty(B, HQ, T, D, device="meta", dtype=torch.bfloat16)
    trace = gpushape.trace(model, (x,), train=True)
    return AuditContext(trace=trace, cost=gpushape.cost(trace, gpu), gpu=gpu)


def _sdpa_s(ctx: AuditContext) -> float:
    """The attention kernels' time, forward and backward (not the gradients' sums)."""
    return ctx.time_s(r for r in ctx.trace.ops if "scaled_dot_product" in r.op)


def test_a_grouped_call_compiled_is_the_plain_call_over_the_query_heads_plus_the_expansion():
    gpu = _gpu(gqa_rate=0.2, plain_rate=0.5)
    ctx = _ctx(2, gpu)
    flash = [r for r in ctx.forward_compute() if grouped(r)]
    assert len(flash) == 1
    eager = _sdpa_s(ctx)
    # the same step with K and V at the query's heads: what the compiled call runs
    expanded = _sdpa_s(_ctx(HQ, gpu))
    bytes_s = ctx.bytes_time_s(2 * B * HQ * T * 2 * D * 2)  # K and V, forward and backward
    assert compiled_flash_s(ctx, flash[0]) == pytest.approx(expanded + bytes_s, rel=0.02)
    saving = compiled_gqa_saving_s(ctx)
    assert saving == pytest.approx(eager + _sums_s(ctx) - expanded - bytes_s, rel=0.02)
    assert saving > 0  # the grouped rate is the slower one here


def _sums_s(ctx: AuditContext) -> float:
    """The backward's sum of the K and V gradients (K and V are one slice here), which the
    traced grouped call's backward counts."""
    (call,) = [r for r in ctx.forward_compute() if grouped(r)]
    return ctx.time_s(r for r in ctx.with_backward(call) if "scaled_dot_product" not in r.op)


def test_the_saving_turns_negative_where_the_grouped_kernel_is_as_fast_and_plain_calls_have_none():
    # grouped as fast as plain: compiled pays the expansion on top
    ctx = _ctx(2, _gpu(gqa_rate=0.5, plain_rate=0.5))
    assert compiled_gqa_saving_s(ctx) - _sums_s(ctx) < 0
    assert compiled_gqa_saving_s(_ctx(HQ, _gpu(gqa_rate=0.2, plain_rate=0.5))) == 0.0


def test_compile_mode_prices_the_grouped_call_as_compiled():
    from gpushape.auditing.modes import step_time

    gpu = _gpu(gqa_rate=0.2, plain_rate=0.5)
    ctx = _ctx(2, gpu)
    eager, compiled = step_time(ctx, "eager"), step_time(ctx, "compile")
    assert compiled.gpu_s < eager.gpu_s - 0.5 * compiled_gqa_saving_s(ctx)
