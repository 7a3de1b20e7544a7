"""Fused attention (flash, memory-efficient, cuDNN, CPU flash), forward and backward.

Q (B, Hq, Tq, D), K (B, Hkv, Tk, D), V (B, Hkv, Tk, Dv). Forward does two matmuls per head,
S = Q K^T and O = P V: 2 x pairs x (D + Dv) FLOPs per (batch, query head), where `pairs` is the
number of (query, key) pairs computed: Tq x Tk, or, with `is_causal`, only the unmasked ones.
Backward recomputes S, then forms dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q:
2 x pairs x (3 D + 2 Dv) FLOPs, 2.5 x the forward when D = Dv. Softmax arithmetic (exp, max,
sum; a few FLOPs per pair on CUDA cores) is not counted, as is the custom for attention.

Causal masking (PyTorch's is_causal: query i attends keys 0..i, top-left aligned): the fused
kernels skip every fully masked tile, so they do about half the work; we count exactly the
unmasked pairs, sum over i < Tq of min(i + 1, Tk) = Tq (Tq + 1) / 2 for Tq <= Tk. This is the
useful work; torch.utils.flop_counter counts the full Tq x Tk square whether causal or not,
which overstates a causal kernel's work by about 2x (tests/tracing/test_flop_counter_differences.py
counts it by hand). An explicit mask (attn_bias) is not inspected: all pairs count.
"""

from __future__ import annotations

from ..records import OpRecord
from .registry import AttentionKernel, Gemm, OpWork, io_bytes, register_formula


def causal_pairs(tq: int, tk: int) -> int:
    """Unmasked (query, key) pairs of a top-left aligned causal mask."""
    if tq <= tk:
        return tq * (tq + 1) // 2
    return tk * (tk + 1) // 2 + (tq - tk) * tk


def _shapes(rec: OpRecord):
    q, k, v = rec.input("query").shape, rec.input("key").shape, rec.input("value").shape
    b, hq, tq, d = q
    tk, dv = k[-2], v[-1]
    causal = bool(rec.params.get("is_causal", False))
    pairs = causal_pairs(tq, tk) if causal else tq * tk
    return b, hq, tq, tk, d, dv, pairs


_BACKENDS = ("flash", "efficient", "cudnn")  # the ones `gpushape probe` may have a rate for


def kernel_of(rec: OpRecord, backward: bool) -> AttentionKernel:
    """The backend from the op's name ("aten._scaled_dot_product_flash_attention" -> "flash"),
    dropout and causal masking from its arguments."""
    name = rec.op.split("._scaled_dot_product_", 1)[-1]
    first = name.split("_", 1)[0]
    backend = first if first in _BACKENDS and "for_cpu" not in name else ""
    return AttentionKernel(
        backend=backend,
        backward=backward,
        dropout=float(rec.params.get("dropout_p", 0.0) or 0.0) > 0,
        causal=bool(rec.params.get("is_causal", False)),
    )


def _work(rec: OpRecord, backward: bool, kernels: int = 1) -> OpWork:
    b, hq, tq, tk, d, dv, pairs = _shapes(rec)
    per_pair = (3 * d + 2 * dv) if backward else (d + dv)
    flops = 2 * b * hq * pairs * per_pair
    # One CTA per (batch, head, block of 128 rows): queries forward, keys backward.
    rows = tk if backward else tq
    gemm = Gemm(
        m=rows,
        n=tq if backward else tk,
        k=d,
        batch=b * hq,
        flops=flops,
        family="attention",
        attention=kernel_of(rec, backward),
    )
    return OpWork(flops=flops, min_bytes=io_bytes(rec), gemms=(gemm,), kernels=kernels)


@register_formula(
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_fused_attention_overrideable",
)
def attention_forward(rec: OpRecord) -> OpWork:
    return _work(rec, backward=False)


@register_formula(
    "aten._scaled_dot_product_flash_attention_backward",
    "aten._scaled_dot_product_efficient_attention_backward",
    "aten._scaled_dot_product_cudnn_attention_backward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    "aten._scaled_dot_product_fused_attention_overrideable_backward",
)
def attention_backward(rec: OpRecord) -> OpWork:
    """Three kernels on CUDA: dO . O row sums, the main pass, the dQ conversion."""
    return _work(rec, backward=True, kernels=3)
