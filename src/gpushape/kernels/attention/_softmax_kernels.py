"""Triton kernels of softmax_dropout: z = scale * x (+ mask), y = dropout(softmax(z)).

Every kernel sees the input as rows of length N of a 4-D view (D0, D1, D2, N) with arbitrary
strides: row r = (i0 * D1 + i1) * D2 + i2. The attention mask is the same 4-D view of the mask
broadcast to x (stride 0 on broadcast dims); causal masking keeps column n <= i2.

A tile is (BLOCK_M rows, BLOCK_G column groups, 8 columns): one Philox call decides the eight
columns of a group (see _attn_philox), so the generator runs once per group, not per element.

Bytes per element, 2-byte dtypes: forward reads x and writes y (4 B; plus 8 B of stats per row);
backward reads x and dy and writes dx (6 B). The dropout mask is recomputed, never stored, and
the softmax is recomputed from x and the per-row (max, sum) statistics, so the backward needs
neither the softmax output nor the mask.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._softmax_math import (
    _dropout_scale,
    _exp_shifted,
    _logits,
    _max_all,
    _normalize,
    _probs,
    _row_offset,
    _safe_max,
    _sum_all,
    _tile_ok,
    _tile_rows,
    _wide,
)


@triton.jit
def softmax_dropout_fwd_kernel(
    x_ptr,
    sx0,
    sx1,
    sx2,
    sxn,  # logits: element (i0, i1, i2, n) at i0*sx0 + i1*sx1 + ...
    mask_ptr,
    sm0,
    sm1,
    sm2,
    smn,  # attention mask broadcast to x; unused when MASK_MODE == 0
    y_ptr,  # output, contiguous (R, N)
    stats_ptr,  # (2, R): row max (0 on a fully masked row), then row sum of exp(z - max)
    seed_ptr,  # (1,) int64 Philox key; unused without dropout
    R,
    D1,
    D2,
    N,  # R = D0 * D1 * D2 rows of N columns
    scale,
    scale_lo,
    threshold,
    keep_scale,
    keep_scale_lo,  # see _wide; drop draws < threshold
    MASK_MODE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    PRECISE: tl.constexpr,
    F64: tl.constexpr,
    X_FLAT: tl.constexpr,
    M_FLAT: tl.constexpr,
    NO_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """One pass per row: rows of up to BLOCK_G * 8 columns, BLOCK_M rows per program."""
    scale = _wide(scale, scale_lo, F64)
    keep_scale = _wide(keep_scale, keep_scale_lo, F64)
    rows = _tile_rows(BLOCK_M)
    groups = tl.arange(0, BLOCK_G)[None, :, None]
    lanes = tl.arange(0, 8)[None, None, :]
    cols = groups * 8 + lanes  # (1, G, 8)
    row_ok = rows < R
    ok = _tile_ok(rows, cols, R, N, BLOCK_M, BLOCK_G, NO_PAD)
    z = _logits(
        x_ptr,
        _row_offset(rows, D1, D2, sx0, sx1, sx2, X_FLAT),
        sxn,
        mask_ptr,
        _row_offset(rows, D1, D2, sm0, sm1, sm2, M_FLAT),
        smn,
        rows,
        D2,
        cols,
        ok,
        scale,
        MASK_MODE,
        IS_CAUSAL,
        F64,
    )
    m = _safe_max(_max_all(z))
    e = _exp_shifted(z, m, PRECISE)
    l = _sum_all(e)
    y = _normalize(e, l, PRECISE)
    if HAS_DROPOUT:
        y = y * _dropout_scale(seed_ptr, rows, groups, lanes, threshold, keep_scale)
    rows64 = rows.to(tl.int64)
    tl.store(y_ptr + rows64 * N + cols, y.to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(stats_ptr + rows64, m, mask=row_ok)
    tl.store(stats_ptr + R + rows64, l, mask=row_ok)


@triton.jit
def softmax_dropout_fwd_looped_kernel(
    x_ptr,
    sx0,
    sx1,
    sx2,
    sxn,
    mask_ptr,
    sm0,
    sm1,
    sm2,
    smn,
    y_ptr,
    stats_ptr,
    seed_ptr,
    R,
    D1,
    D2,
    N,
    scale,
    scale_lo,
    threshold,
    keep_scale,
    keep_scale_lo,
    MASK_MODE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    PRECISE: tl.constexpr,
    F64: tl.constexpr,
    X_FLAT: tl.constexpr,
    M_FLAT: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """Rows longer than one tile: one row per program, an online (max, sum) pass over chunks of
    BLOCK_G * 8 columns, then a second pass that writes y (reads x twice)."""
    scale = _wide(scale, scale_lo, F64)
    keep_scale = _wide(keep_scale, keep_scale_lo, F64)
    rows = _tile_rows(1)
    groups = tl.arange(0, BLOCK_G)[None, :, None]
    lanes = tl.arange(0, 8)[None, None, :]
    x_row = _row_offset(rows, D1, D2, sx0, sx1, sx2, X_FLAT)
    mask_row = _row_offset(rows, D1, D2, sm0, sm1, sm2, M_FLAT)
    m = tl.full((1, 1, 1), float("-inf"), tl.float64 if F64 else tl.float32)
    l = tl.zeros((1, 1, 1), tl.float64 if F64 else tl.float32)
    for start in range(0, N, BLOCK_G * 8):
        cols = start + groups * 8 + lanes
        z = _logits(
            x_ptr,
            x_row,
            sxn,
            mask_ptr,
            mask_row,
            smn,
            rows,
            D2,
            cols,
            cols < N,
            scale,
            MASK_MODE,
            IS_CAUSAL,
            F64,
        )
        m_new = tl.maximum(m, _max_all(z))
        m_new_safe = _safe_max(m_new)
        rescale = tl.where(m == float("-inf"), 0.0, _exp_shifted(m, m_new_safe, PRECISE))
        l = l * rescale + _sum_all(_exp_shifted(z, m_new_safe, PRECISE))
        m = m_new
    m = _safe_max(m)
    rows64 = rows.to(tl.int64)
    for start in range(0, N, BLOCK_G * 8):
        cols = start + groups * 8 + lanes
        z = _logits(
            x_ptr,
            x_row,
            sxn,
            mask_ptr,
            mask_row,
            smn,
            rows,
            D2,
            cols,
            cols < N,
            scale,
            MASK_MODE,
            IS_CAUSAL,
            F64,
        )
        y = _probs(z, m, l, PRECISE)
        if HAS_DROPOUT:
            y = y * _dropout_scale(
                seed_ptr, rows, start // 8 + groups, lanes, threshold, keep_scale
            )
        tl.store(y_ptr + rows64 * N + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)
    tl.store(stats_ptr + rows64, m)
    tl.store(stats_ptr + R + rows64, l)
