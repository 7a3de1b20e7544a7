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
