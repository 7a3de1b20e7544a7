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

flash-attn's own ops (`flash_attn._flash_attn_forward` / `_backward`, what Hugging Face's
"flash_attention_2" calls) take Q, K, V as (B, T, H, D), `causal`, and a sliding window
(`window_size_left/right`, -1 unbounded): only the pairs inside the window count. Its
variable-length ops (a padding mask given) are not priced here: their sequence lengths are
values a meta trace does not have.
"""

from __future__ import annotations

import dataclasses

from ..records import OpRecord
from .registry import AttentionKernel, Gemm, OpWork, io_bytes, register_formula


def causal_pairs(tq: int, tk: int) -> int:
    """Unmasked (query, key) pairs of a top-left aligned causal mask."""
    if tq <= tk:
        return tq * (tq + 1) // 2
    return tk * (tk + 1) // 2 + (tq - tk) * tk


def window_pairs(tq: int, tk: int, left: int, right: int) -> int:
    """Unmasked pairs when query i attends keys i - left .. i + right (flash-attn's sliding
    window; -1: unbounded on that side; queries and keys aligned, Tq <= Tk as in training)."""
    last = tk - 1
    reach = last if right < 0 else right
    # sum over i of min(i + reach, last) and of max(i - left, 0), as arithmetic series
    j0 = min(max(last - reach, 0), tq)
    highs = j0 * reach + j0 * (j0 - 1) // 2 + (tq - j0) * last
    m = max(tq - left, 0) if left >= 0 else 0
    lows = m * (m - 1) // 2
    return highs - lows + tq


def _shapes(rec: OpRecord):
    if rec.op.startswith(FLASH_ATTN):  # flash-attn's own ops: (B, T, H, D)
        q, k, v = rec.input("q").shape, rec.input("k").shape, rec.input("v").shape
        b, tq, hq, d = q
        tk, dv = k[1], v[-1]
        left = int(rec.params.get("window_size_left", -1))
        right = 0 if _causal(rec) else int(rec.params.get("window_size_right", -1))
        pairs = tq * tk if left < 0 and right < 0 else window_pairs(tq, tk, left, right)
        return b, hq, tq, tk, d, dv, pairs
    q, k, v = rec.input("query").shape, rec.input("key").shape, rec.input("value").shape
    b, hq, tq, d = q
    tk, dv = k[-2], v[-1]
    pairs = causal_pairs(tq, tk) if _causal(rec) else tq * tk
    return b, hq, tq, tk, d, dv, pairs


def _causal(rec: OpRecord) -> bool:
    return bool(rec.params.get("is_causal", rec.params.get("causal", False)))


_BACKENDS = ("flash", "efficient", "cudnn")  # the ones `gpushape probe` may have a rate for
# flash-attn's package (Hugging Face's attn_implementation="flash_attention_2"): its custom ops
# run the FlashAttention-2 kernels PyTorch's flash backend is built from, priced at that rate
FLASH_ATTN = "flash_attn._flash_attn_"


def kernel_of(rec: OpRecord, backward: bool) -> AttentionKernel:
    """The backend from the op's name ("aten._scaled_dot_product_flash_attention" -> "flash";
    cuDNN's given a mask, "cudnn_masked"), dropout and causal masking from its arguments."""
    name = rec.op.split("._scaled_dot_product_", 1)[-1]
    first = name.split("_", 1)[0]
    backend = first if first in _BACKENDS and "for_cpu" not in name else ""
    if rec.op.startswith(FLASH_ATTN):
        backend = "flash"
    if backend == "cudnn" and rec.has_input("attn_bias"):
        backend = "cudnn_masked"  # every score computed, the mask read: its own rates
    return AttentionKernel(
        backend=backend,
        backward=backward,
        dropout=float(rec.params.get("dropout_p", 0.0) or 0.0) > 0,
        causal=_causal(rec),
        gqa=_grouped(rec),
    )


def _grouped(rec: OpRecord) -> bool:
    """K and V with fewer heads than Q (grouped-query attention, SDPA's enable_gqa)."""
    if rec.op.startswith(FLASH_ATTN):  # (B, T, H, D)
        return rec.input("k").shape[2] < rec.input("q").shape[2]
    q, k = rec.input("query").shape, rec.input("key").shape
    return len(q) == len(k) == 4 and k[1] < q[1]


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
    "flash_attn._flash_attn_forward",
)
def attention_forward(rec: OpRecord) -> OpWork:
    return _work(rec, backward=False)


@register_formula(
    "aten._scaled_dot_product_flash_attention_backward",
    "aten._scaled_dot_product_efficient_attention_backward",
    "aten._scaled_dot_product_cudnn_attention_backward",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    "aten._scaled_dot_product_fused_attention_overrideable_backward",
    "flash_attn._flash_attn_backward",
)
def attention_backward(rec: OpRecord) -> OpWork:
    """Three kernels on CUDA: dO . O row sums, the main pass, the dQ conversion (a fourth sums
    a grouped-query call's dK and dV over the query heads a K/V head serves)."""
    work = _work(rec, backward=True, kernels=3)
    passes = backward_passes(rec)
    if not passes:
        return work
    return dataclasses.replace(work, passes=passes, kernels=3 + (len(passes) > 3))


# The kernels FlashAttention-2's and cuDNN's backward run beside the main one (seen in the
# profiler on the H100 and the H200: `compute_dot_do_o`, `convert_dq_to_16bits`,
# `fmha_reduce_head`, a memset): memory-bound, priced at the "attention_pass" family's rate
# (the memset at the copy rate). The memory-efficient kernel and CPU's flash run none.
_PASS_OPS = (
    "aten._scaled_dot_product_flash_attention_backward",
    "aten._scaled_dot_product_cudnn_attention_backward",
    FLASH_ATTN + "backward",
)
ATTENTION_PASS = "attention_pass"


def backward_passes(rec: OpRecord) -> tuple[tuple[int, str | None], ...]:
    """(bytes, memory family) of each memory-bound kernel a fused attention backward runs
    beside its main one: dQ's float32 accumulator zeroed; the row sums of dO . O (dO and O
    read, a float32 per row written); dQ converted from float32; and, where K and V have fewer
    heads than Q, dK and dV summed over the query heads each K/V head serves."""
    if not rec.op.startswith(_PASS_OPS):
        return ()
    b, hq, tq, tk, d, dv, _ = _shapes(rec)
    size = rec.inputs[0].itemsize if rec.inputs else 2
    rows, dq = b * hq * tq, b * hq * tq * d
    passes: list[tuple[int, str | None]] = [
        (4 * dq, None),
        (2 * rows * dv * size + 4 * rows, ATTENTION_PASS),
        (dq * (4 + size), ATTENTION_PASS),
    ]
    if _grouped(rec):
        hkv = (
            rec.input("k").shape[2] if rec.op.startswith(FLASH_ATTN) else rec.input("key").shape[1]
        )
        expanded = b * hq * tk * (d + dv) * size
        passes.append((expanded + b * hkv * tk * (d + dv) * size, ATTENTION_PASS))
    return tuple(passes)
