"""The backward kernels of softmax_dropout (conventions and byte counts: `_softmax_kernels.py`):
dx from x and dy alone, the softmax recomputed from the per-row (max, sum) statistics and the
dropout mask regenerated from the seed."""

from __future__ import annotations

import triton
import triton.language as tl

from ._softmax_math import (
    _dropout_scale,
    _logits,
    _probs,
    _row_offset,
    _sum_all,
    _tile_ok,
    _tile_rows,
    _wide,
)


@triton.jit
def softmax_dropout_bwd_kernel(
    dy_ptr,
    sd0,
    sd1,
    sd2,
    sdn,  # grad of y, any strides (stride 0 where expanded)
    x_ptr,
    sx0,
    sx1,
    sx2,
    sxn,
    mask_ptr,
    sm0,
    sm1,
    sm2,
    smn,  # as in the forward
    dx_ptr,  # grad of x, contiguous (R, N)
    stats_ptr,
    seed_ptr,  # the forward's (2, R) row statistics and its seed
    R,
    D1,
    D2,
    N,
    scale,
    scale_lo,
    threshold,
    keep_scale,
    keep_scale_lo,
    grad_scale,
    grad_scale_lo,  # dx = grad_scale * dL/dz (scale for x; 1 for a mask's grad)
    MASK_MODE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    PRECISE: tl.constexpr,
    F64: tl.constexpr,
    X_FLAT: tl.constexpr,
    M_FLAT: tl.constexpr,
    DY_FLAT: tl.constexpr,
    NO_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """dL/dz = s * (g - sum(s * g)) with g = dy * keep / (1 - p) and s recomputed from x."""
    scale = _wide(scale, scale_lo, F64)
    keep_scale = _wide(keep_scale, keep_scale_lo, F64)
    grad_scale = _wide(grad_scale, grad_scale_lo, F64)
    rows = _tile_rows(BLOCK_M)
    groups = tl.arange(0, BLOCK_G)[None, :, None]
    lanes = tl.arange(0, 8)[None, None, :]
    cols = groups * 8 + lanes
    row_ok = rows < R
    ok = _tile_ok(rows, cols, R, N, BLOCK_M, BLOCK_G, NO_PAD)
    rows64 = rows.to(tl.int64)
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
    m = tl.load(stats_ptr + rows64, mask=row_ok, other=0.0)
    l = tl.load(stats_ptr + R + rows64, mask=row_ok, other=1.0)
    s = _probs(z, m, l, PRECISE)
    dy_row = _row_offset(rows, D1, D2, sd0, sd1, sd2, DY_FLAT)
    g = tl.load(dy_ptr + dy_row + cols.to(tl.int64) * sdn, mask=ok, other=0.0).to(s.dtype)
    if HAS_DROPOUT:
        g = g * _dropout_scale(seed_ptr, rows, groups, lanes, threshold, keep_scale)
    dz = s * (g - _sum_all(s * g))
    tl.store(dx_ptr + rows64 * N + cols, (dz * grad_scale).to(dx_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _chunk_probs_and_grads(
    start,
    groups,
    lanes,
    rows,
    m,
    l,
    x_ptr,
    x_row,
    sxn,
    mask_ptr,
    mask_row,
    smn,
    dy_ptr,
    dy_row,
    sdn,
    seed_ptr,
    D2,
    N,
    scale,
    threshold,
    keep_scale,
    MASK_MODE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    PRECISE: tl.constexpr,
    F64: tl.constexpr,
):
    """One column chunk of a long row: its columns, softmax s (recomputed from the row's max m
    and sum l) and the gradient g reaching s (dy through the regenerated dropout mask)."""
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
    s = _probs(z, m, l, PRECISE)
    g = tl.load(dy_ptr + dy_row + cols.to(tl.int64) * sdn, mask=cols < N, other=0.0).to(s.dtype)
    if HAS_DROPOUT:
        g = g * _dropout_scale(seed_ptr, rows, start // 8 + groups, lanes, threshold, keep_scale)
    return cols, s, g


@triton.jit
def softmax_dropout_bwd_looped_kernel(
    dy_ptr,
    sd0,
    sd1,
    sd2,
    sdn,
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
    dx_ptr,
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
    grad_scale,
    grad_scale_lo,
    MASK_MODE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    PRECISE: tl.constexpr,
    F64: tl.constexpr,
    X_FLAT: tl.constexpr,
    M_FLAT: tl.constexpr,
    DY_FLAT: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """Long rows: one pass for sum(s * g), a second that writes dx (reads x and dy twice)."""
    scale = _wide(scale, scale_lo, F64)
    keep_scale = _wide(keep_scale, keep_scale_lo, F64)
    grad_scale = _wide(grad_scale, grad_scale_lo, F64)
    rows = _tile_rows(1)
    groups = tl.arange(0, BLOCK_G)[None, :, None]
    lanes = tl.arange(0, 8)[None, None, :]
    x_row = _row_offset(rows, D1, D2, sx0, sx1, sx2, X_FLAT)
    mask_row = _row_offset(rows, D1, D2, sm0, sm1, sm2, M_FLAT)
    dy_row = _row_offset(rows, D1, D2, sd0, sd1, sd2, DY_FLAT)
    rows64 = rows.to(tl.int64)
    m = tl.load(stats_ptr + rows64)
    l = tl.load(stats_ptr + R + rows64)
    total = tl.zeros((1, 1, 1), m.dtype)
    for start in range(0, N, BLOCK_G * 8):
        cols, s, g = _chunk_probs_and_grads(
            start,
            groups,
            lanes,
            rows,
            m,
            l,
            x_ptr,
            x_row,
            sxn,
            mask_ptr,
            mask_row,
            smn,
            dy_ptr,
            dy_row,
            sdn,
            seed_ptr,
            D2,
            N,
            scale,
            threshold,
            keep_scale,
            MASK_MODE,
            IS_CAUSAL,
            HAS_DROPOUT,
            PRECISE,
            F64,
        )
        total += _sum_all(s * g)
    for start in range(0, N, BLOCK_G * 8):
        cols, s, g = _chunk_probs_and_grads(
            start,
            groups,
            lanes,
            rows,
            m,
            l,
            x_ptr,
            x_row,
            sxn,
            mask_ptr,
            mask_row,
            smn,
            dy_ptr,
            dy_row,
            sdn,
            seed_ptr,
            D2,
            N,
            scale,
            threshold,
            keep_scale,
            MASK_MODE,
            IS_CAUSAL,
            HAS_DROPOUT,
            PRECISE,
            F64,
        )
        dz = s * (g - total)
        tl.store(
            dx_ptr + rows64 * N + cols, (dz * grad_scale).to(dx_ptr.dtype.element_ty), mask=cols < N
        )
