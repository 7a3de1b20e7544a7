"""Fused attention: forward and backward FLOPs, causal counting, and the meta-device routing.

Causal attention counts only the unmasked (query, key) pairs, because the fused kernels skip
fully masked tiles and do about half the work (FlashAttention-2, section 3.1, "causal masking").
The hand count below counts the ones of PyTorch's own causal mask.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _trace_helpers import meta, ops_named, trace_fn, work

from gpushape.tracing.flops.attention import causal_pairs

B, H, D = 2, 3, 16


def _sdpa(q, k, v, mask=None, causal=False):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def hand_pairs(tq: int, tk: int, causal: bool) -> int:
    if not causal:
        return tq * tk
    return int(torch.ones(tq, tk, dtype=torch.bool).tril().sum())  # PyTorch's is_causal mask


@pytest.mark.parametrize("tq,tk", [(8, 8), (5, 9), (9, 5), (1, 7)])
def test_causal_pairs_match_pytorchs_mask(tq, tk):
    assert causal_pairs(tq, tk) == hand_pairs(tq, tk, True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dv", [D, 8])
def test_flash_forward_and_backward(causal, dv):
    tq = tk = 12
    q = meta(B, H, tq, D, dtype=torch.bfloat16, requires_grad=True)
    k = meta(B, H, tk, D, dtype=torch.bfloat16, requires_grad=True)
    v = meta(B, H, tk, dv, dtype=torch.bfloat16, requires_grad=True)
    t = trace_fn(lambda q, k, v: _sdpa(q, k, v, causal=causal), (q, k, v), train=True)
    kernel = "flash" if dv == D else "efficient"  # flash needs equal head sizes
    (fwd,) = ops_named(t, f"_scaled_dot_product_{kernel}_attention")
    (bwd,) = ops_named(t, f"_scaled_dot_product_{kernel}_attention_backward")
    pairs = hand_pairs(tq, tk, causal)
    # forward: S = Q K^T (D MACs per pair) and O = P V (Dv per pair)
    assert work(fwd).flops == 2 * B * H * pairs * (D + dv)
    # backward: S again (D), dV = P^T dO (Dv), dP = dO V^T (Dv), dQ = dS K (D), dK = dS^T Q (D)
    assert work(bwd).flops == 2 * B * H * pairs * (3 * D + 2 * dv)
    assert bwd.fwd_index == fwd.index and bwd.params.get("is_causal", False) == causal


def test_efficient_attention_with_a_boolean_mask_counts_every_pair():
    q = meta(B, H, 10, D)  # fp32: flash needs fp16/bf16, the memory-efficient kernel runs
    mask = torch.empty(B, 1, 1, 10, dtype=torch.bool, device="meta")
    t = trace_fn(_sdpa, (q, q, q, mask))
    (fwd,) = ops_named(t, "_scaled_dot_product_efficient_attention")
    assert work(fwd).flops == 2 * B * H * 10 * 10 * (2 * D)
    assert fwd.has_input("attn_bias")  # the mask became an additive bias, as on CUDA
    assert work(fwd).min_bytes >= fwd.input("attn_bias").nbytes


def test_attention_bytes_read_qkv_and_write_the_output_once():
    q = meta(B, H, 64, D, dtype=torch.float16)
    t = trace_fn(_sdpa, (q, q.clone(), q.clone()))
    (fwd,) = ops_named(t, "_scaled_dot_product_flash_attention")
    qkv = 3 * B * H * 64 * D * 2
    out = B * H * 64 * D * 2
    lse = B * H * 64 * 4  # logsumexp in fp32, kept for backward
    rng = 3 * 8  # the dropout RNG's seed (2,) and offset (), uint64
    assert work(fwd).min_bytes == qkv + out + lse + rng  # no T x T score matrix in memory


def test_routing_falls_back_to_math_where_cuda_would():
    q = meta(B, H, 6, 7)  # fp32 head size 7: not a multiple of 4 elements
    t = trace_fn(_sdpa, (q, q, q))
    assert not [op for op in t.ops if "attention" in op.op]
    assert ops_named(t, "bmm") and ops_named(t, "_safe_softmax")


def test_no_routing_on_a_real_device():
    q = torch.randn(1, 2, 4, 8)
    t = trace_fn(_sdpa, (q, q, q), device="cpu")
    assert not ops_named(t, "_scaled_dot_product_flash_attention")
    assert ops_named(t, "_scaled_dot_product_flash_attention_for_cpu")  # the CPU kernel
    (fwd,) = ops_named(t, "_scaled_dot_product_flash_attention_for_cpu")
    assert work(fwd).flops == 2 * 1 * 2 * 4 * 4 * (8 + 8)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_packages_ops_cost_what_sdpa_flash_costs(causal):
    """flash-attn's own ops (Hugging Face's "flash_attention_2"), Q, K, V as (B, T, H, D):
    the same FLOPs, bytes, kernels and rate as SDPA's flash kernel on the same attention."""
    from _flash_attn import FlashAttnFunc

    import gpushape

    t = 256
    qkv = [meta(B, t, H, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    fa = trace_fn(lambda q, k, v: FlashAttnFunc.apply(q, k, v, 0.0, causal), tuple(qkv), train=True)
    hqd = [meta(B, H, t, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    sd = trace_fn(lambda q, k, v: _sdpa(q, k, v, causal=causal), tuple(hqd), train=True)
    for name, phase in (("_flash_attn_forward", "forward"), ("_flash_attn_backward", "backward")):
        (a,) = ops_named(fa, name)
        (b,) = [r for r in ops_named(sd, "_scaled_dot_product_flash_attention" + (
            "_backward" if phase == "backward" else "")) if r.phase == phase]  # fmt: skip
        assert a.phase == phase and work(a).flops == work(b).flops > 0
        assert work(a).kernels == work(b).kernels
        assert work(a).gemms[0].attention == work(b).gemms[0].attention
    costs = [gpushape.cost(x, "h200") for x in (fa, sd)]
    timed = [sum(c.kernel_time_s for c in cost.ops if "attn" in c.op or "attention" in c.op)
             for cost in costs]  # fmt: skip
    assert timed[0] == pytest.approx(timed[1], rel=0.05)


def test_flash_attn_sliding_window_counts_the_pairs_inside_it():
    from _flash_attn import FlashAttnFunc

    t, window = 64, 15
    qkv = [meta(1, t, 1, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    fa = trace_fn(lambda q, k, v: FlashAttnFunc.apply(q, k, v, 0.0, True, (window, -1)), tuple(qkv))
    (fwd,) = ops_named(fa, "_flash_attn_forward")
    kept = torch.ones(t, t, dtype=torch.bool).tril().triu(-window).sum()  # i - 15 <= j <= i
    assert work(fwd).flops == 2 * int(kept) * (16 + 16)
