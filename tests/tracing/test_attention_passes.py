"""A fused attention backward's kernels beside its main one (cuDNN's and FlashAttention-2's
dO . O row sums, dQ's float32 zeroing and conversion, a grouped-query call's head reduction):
their bytes, and the cost model adding their time to the op's rather than hiding it under the
main kernel's compute."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, only, trace_fn, work

import gpushape
from gpushape.hardware import get_gpu
from gpushape.tracing.cost import op_cost
from gpushape.tracing.flops.attention import ATTENTION_PASS, backward_passes

B, HQ, T, D = 2, 8, 256, 64


def _backward(hkv: int = HQ):
    q = meta(B, HQ, T, D, dtype=torch.bfloat16, requires_grad=True)
    k, v = (meta(B, hkv, T, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    extra = {"enable_gqa": True} if hkv < HQ else {}
    tr = trace_fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **extra), (q, k, v),
                  train=True)  # fmt: skip
    return only(tr, "_scaled_dot_product_flash_attention_backward")


def test_the_passes_move_what_the_kernels_read_and_write():
    rec = _backward()
    rows, dq = B * HQ * T, B * HQ * T * D
    assert backward_passes(rec) == (
        (4 * dq, None),  # the float32 dQ accumulator zeroed: a memset at the copy rate
        (2 * rows * D * 2 + 4 * rows, ATTENTION_PASS),  # dO and O read, a float32 a row
        (dq * (4 + 2), ATTENTION_PASS),  # dQ read in float32, written in bf16
    )
    assert work(rec).kernels == 3  # the memset is no kernel


def test_a_grouped_call_also_sums_dk_and_dv_over_the_heads_a_kv_head_serves():
    rec = _backward(hkv=2)
    passes = backward_passes(rec)
    assert len(passes) == 4 and work(rec).kernels == 4
    assert passes[-1] == (B * HQ * T * 2 * D * 2 + B * 2 * T * 2 * D * 2, ATTENTION_PASS)


def test_the_memory_efficient_and_cpu_kernels_run_none():
    q, k, v = (meta(B, HQ, T, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mask = meta(B, 1, T, T, dtype=torch.bool)
    tr = trace_fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                  (q, k, v), train=True)  # fmt: skip
    backward = [r for r in tr.ops if "attention" in r.op and r.phase == "backward"]
    assert backward and all(backward_passes(r) == () for r in backward)


def test_their_time_is_added_to_the_ops_at_their_familys_rate():
    rec = _backward()
    spec = get_gpu("h200")
    gpu = spec.replace(
        achievable=dataclasses.replace(
            spec.achievable, memory_efficiency={ATTENTION_PASS: 0.5}, kernel_floor_s=0.0
        )
    )
    bandwidth = gpu.attainable_bandwidth_bytes_per_s()
    expected = sum(n / (bandwidth * (0.5 if f else 1.0)) for n, f in backward_passes(rec))
    c = op_cost(rec, gpu)
    assert c.passes_s == pytest.approx(expected)
    assert c.kernel_time_s == pytest.approx(max(c.compute_s, c.memory_s) + c.passes_s)
    none = dataclasses.replace(work(rec), passes=())
    assert op_cost(rec, gpu, work=none).kernel_time_s == pytest.approx(c.kernel_time_s - expected)


def test_a_trace_prices_them_in_the_attention_modules_backward():
    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    qkv = tuple(meta(B, HQ, T, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    report = gpushape.cost(gpushape.trace(Attn(), qkv, train=True), "h200")
    (bwd,) = [o for o in report.ops if "attention" in o.op and o.phase == "backward"]
    assert bwd.passes_s > 0
