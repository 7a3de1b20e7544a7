"""Shared pieces of the softmax_dropout kernels (`_softmax_kernels.py` forward,
`_softmax_bwd_kernels.py` backward): the row addressing, the masked and scaled logits, the
numerically safe exp / max / normalize, the dropout scale from Philox, and the tile masks."""

from __future__ import annotations

import triton
import triton.language as tl

from ._philox import dropout_keep, seed_key

NO_MASK = tl.constexpr(0)
BOOL_MASK = tl.constexpr(1)
ADDITIVE_MASK = tl.constexpr(2)
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _row_offset(rows, D1, D2, s0, s1, s2, FLAT: tl.constexpr):
    """Offset of row r = (i0 * D1 + i1) * D2 + i2 in a 4-D view with strides (s0, s1, s2).
    rows are int32 (host checks R < 2^31; 32-bit division is ~5x cheaper than 64-bit), the
    offset is int64. FLAT: the tensor is a 2-D (R, N) view, row r at r * s2, no division."""
    if FLAT:
        return rows.to(tl.int64) * s2
    else:
        i2 = rows % D2
        outer = rows // D2
        return (
            (outer // D1).to(tl.int64) * s0 + (outer % D1).to(tl.int64) * s1 + i2.to(tl.int64) * s2
        )


@triton.jit
def _logits(
    x_ptr,
    x_row,
    sxn,
    mask_ptr,
    mask_row,
    smn,
    rows,
    D2,
    cols,
    ok,
    scale,
    MASK_MODE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    F64: tl.constexpr,
):
    """z = scale * x (+ additive mask), -inf where masked out, causal-masked or padding."""
    # int64 column offsets: a large column stride (a transposed x) times N can pass 2^31
    x = tl.load(x_ptr + x_row + cols.to(tl.int64) * sxn, mask=ok, other=0.0)
    z = x.to(tl.float64) * scale if F64 else x.to(tl.float32) * scale
    mask_ptrs = mask_ptr + mask_row + cols.to(tl.int64) * smn
    if MASK_MODE == BOOL_MASK:
        attend = tl.load(mask_ptrs, mask=ok, other=0)
        ok = ok & (attend != 0)
    if MASK_MODE == ADDITIVE_MASK:
        z = z + tl.load(mask_ptrs, mask=ok, other=0.0).to(z.dtype)
    if IS_CAUSAL:
        ok = ok & (cols <= rows % D2)  # query index i2 of the row
    return tl.where(ok, z, float("-inf"))


@triton.jit
def _exp_shifted(z, m, PRECISE: tl.constexpr):
    """exp(z - m). PRECISE (fp32 data): a correctly rounded double-precision exp, so fp32
    results are as accurate as PyTorch's. Otherwise exp2((z - m) * log2(e)) on the flush-to-zero
    MUFU.EX2 (tl.exp would add a denormal fix-up): error relative to |z - m|, as in PyTorch's
    exp(z - m), and far below fp16/bf16 rounding."""
    if PRECISE:
        return tl.exp((z - m).to(tl.float64)).to(z.dtype)
    else:
        return tl.exp2((z - m) * _LOG2E)


@triton.jit
def _safe_max(m):
    """A row whose entries are all -inf gets max 0, so exp(z - max) = 0 and its output is 0."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def _normalize(e, l, PRECISE: tl.constexpr):
    """e / l with l the (M, 1, 1) row sum; 0 on a fully masked row (l = 0)."""
    l_safe = tl.where(l == 0.0, 1.0, l)
    if PRECISE:
        return tl.math.div_rn(e, l_safe + tl.zeros_like(e))
    else:
        return e * (1.0 / l_safe)


@triton.jit
def _probs(z, m, l, PRECISE: tl.constexpr):
    """softmax from the row max m and row sum l, the same instructions as the forward's."""
    return _normalize(_exp_shifted(z, m, PRECISE), l, PRECISE)


@triton.jit
def _dropout_scale(seed_ptr, rows, groups, lanes, threshold, keep_scale):
    """keep_scale where the element is kept, 0 where dropped; (M, G, 8)."""
    k0, k1 = seed_key(seed_ptr)
    keep = dropout_keep(k0, k1, rows, groups, lanes, threshold)
    return tl.where(keep, keep_scale, 0.0)


@triton.jit
def _max_all(t):
    return tl.max(tl.max(t, axis=2), axis=1)[:, None, None]


@triton.jit
def _sum_all(t):
    return tl.sum(tl.sum(t, axis=2), axis=1)[:, None, None]


@triton.jit
def _wide(hi, lo, F64: tl.constexpr):
    """A Python float passed as two fp32 kernel arguments (hi + lo, ~48 bits): float64 data gets
    its scale factors at float64 accuracy; other dtypes use hi alone."""
    if F64:
        return tl.cast(hi, tl.float64) + tl.cast(lo, tl.float64)
    else:
        return hi


@triton.jit
def _tile_rows(BLOCK_M: tl.constexpr):
    """(BLOCK_M, 1, 1) int32 row indices of this program."""
    return (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))[:, None, None]


@triton.jit
def _tile_ok(rows, cols, R, N, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, NO_PAD: tl.constexpr):
    """In-bounds mask of the tile. NO_PAD (N == BLOCK_G * 8 and R % BLOCK_M == 0): a constant,
    so loads and stores go unpredicated and the -inf padding selects fold away."""
    if NO_PAD:
        return tl.full((BLOCK_M, BLOCK_G, 8), 1, tl.int1)
    else:
        return (rows < R) & (cols < N)
