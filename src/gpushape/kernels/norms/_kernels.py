"""Triton kernels shared by the row-normalisation ops (layer_norm_gelu, add_layer_norm, rms_norm).

One family of kernels, specialised at compile time by constexpr flags, so the three ops share one
tested implementation instead of three near-copies:
  ACT           0 = identity, 1 = exact GELU (erf), 2 = tanh-approximated GELU
  IS_RMS        RMSNorm (no mean, no bias) instead of LayerNorm
  HAS_RESIDUAL  add a residual to x first and store the sum (pre-norm transformer block)
  HAS_W, HAS_B  elementwise affine weight / bias present
  HAS_DS        backward: a gradient flows into the stored sum as well
  ACC           accumulation dtype: float32, or float64 for float64 inputs (gradcheck)
  FAST          exact GELU's normal CDF from a logistic fit instead of erf (bfloat16 output)
  EVEN_N        N is a multiple of BLOCK_N: no padding columns to mask out of the row sums
  PREFETCH      persistent backward: load x, dy this many tiles (0, 1, 2) ahead
  RELOAD_WB     persistent backward: reload weight / bias every tile (fewer registers)

All 2-D tensors are contiguous (M, N) rows; row offsets are computed in int64 so that tensors past
2**31 elements index correctly. Statistics (mean, rstd) are (M,) tensors in ACC.

Two paths per direction:
  - single-block: a row fits one register tile (BLOCK_N >= N): read x once, write y once.
  - looped (multi-block): N past the single-block limit; columns are walked in chunks and the
    re-reads of a row come mostly from L2.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._math import _affine_act, _grads_at


@triton.jit
def _norm_fwd_tile_kernel(
    X,  # (M, N) input rows
    R,  # (M, N) residual, added to X first (HAS_RESIDUAL)
    S,  # (M, N) out: X + R rounded to X's dtype, as PyTorch's add rounds (HAS_RESIDUAL)
    Y,  # (M, N) out: act(xhat * W + B) in Y's dtype
    W,  # (N,) weight (HAS_W)
    B,  # (N,) bias (HAS_B)
    MEAN,  # (M,) out, ACC (LayerNorm only)
    RSTD,  # (M,) out, ACC: 1 / sqrt(var + eps)
    M,
    N,
    eps,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    IS_RMS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    """BLOCK_M whole rows per program, each held in registers: read x once, write y once."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]  # (BLOCK_M, BLOCK_N)
    x = tl.load(X + offs, mask=mask, other=0.0).to(ACC)
    if HAS_RESIDUAL:
        r = tl.load(R + offs, mask=mask, other=0.0).to(ACC)
        s = (x + r).to(S.dtype.element_ty)
        tl.store(S + offs, s, mask=mask)
        x = s.to(ACC)
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=1) / N  # (BLOCK_M,)
        xc = x - mean[:, None]
        if not EVEN_N:  # padding columns must not enter the variance
            xc = tl.where(mask, xc, 0.0)
        tl.store(MEAN + rows, mean, mask=row_ok)
    var = tl.sum(xc * xc, axis=1) / N  # two passes over registers: no cancellation
    rstd = tl.rsqrt(var + eps)
    tl.store(RSTD + rows, rstd, mask=row_ok)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)[None, :] if HAS_W else 1.0
    b = tl.load(B + cols, mask=col_ok, other=0.0).to(ACC)[None, :] if HAS_B else 0.0
    y = _affine_act(xc * rstd[:, None], w, b, ACT, FAST, HAS_W, HAS_B)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_fwd_looped_kernel(
    X,
    R,
    S,
    Y,
    W,
    B,
    MEAN,
    RSTD,  # as in _norm_fwd_tile_kernel
    N,
    eps,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    IS_RMS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One row per program, walked in BLOCK_N chunks: pass 1 sums, pass 2 normalises.

    Pass 1 sums x - x[0] and its square: shifting by one element of the row keeps
    E[d^2] - E[d]^2 from cancelling when the mean is far from zero.
    """
    base = tl.program_id(0).to(tl.int64) * N
    cols = tl.arange(0, BLOCK_N)
    shift = 0.0
    if not IS_RMS:
        shift = tl.load(X + base).to(ACC)
        if HAS_RESIDUAL:
            shift = (shift + tl.load(R + base).to(ACC)).to(S.dtype.element_ty).to(ACC)
    acc_sum = tl.zeros([BLOCK_N], dtype=ACC)
    acc_sq = tl.zeros([BLOCK_N], dtype=ACC)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        m = c < N
        x = tl.load(X + base + c, mask=m, other=0.0).to(ACC)
        if HAS_RESIDUAL:
            s = (x + tl.load(R + base + c, mask=m, other=0.0).to(ACC)).to(S.dtype.element_ty)
            tl.store(S + base + c, s, mask=m)
            x = s.to(ACC)
        d = tl.where(m, x - shift, 0.0)
        acc_sum += d
        acc_sq += d * d
    mean_d = tl.sum(acc_sum, axis=0) / N
    var = tl.sum(acc_sq, axis=0) / N
    if not IS_RMS:
        var = var - mean_d * mean_d
        # Rounding can leave var slightly negative; a NaN row stays NaN through its mean.
        var = tl.where(var > 0.0, var, 0.0)
        tl.store(MEAN + tl.program_id(0), shift + mean_d)
    rstd = tl.rsqrt(var + eps)
    tl.store(RSTD + tl.program_id(0), rstd)
    mean = shift + mean_d if not IS_RMS else 0.0
    if HAS_RESIDUAL:
        tl.debug_barrier()  # pass 2 re-reads S written by other threads of this program
    src = S if HAS_RESIDUAL else X
    for start in range(0, N, BLOCK_N):
        c = start + cols
        m = c < N
        x = tl.load(src + base + c, mask=m, other=0.0).to(ACC)
        w = tl.load(W + c, mask=m, other=0.0).to(ACC) if HAS_W else 1.0
        b = tl.load(B + c, mask=m, other=0.0).to(ACC) if HAS_B else 0.0
        y = _affine_act((x - mean) * rstd, w, b, ACT, FAST, HAS_W, HAS_B)
        tl.store(Y + base + c, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _tile(rows, cols, M, N):
    """Offsets (int64) and mask of the (rows, cols) tile of an (M, N) row-major tensor."""
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return rows.to(tl.int64)[:, None] * N + cols[None, :], mask


@triton.jit
def _norm_bwd_kernel(
    DY,  # (M, N) grad of Y
    DS,  # (M, N) grad of the stored sum S, added to DX (HAS_DS)
    X,  # (M, N) the normalised input (S for add_layer_norm)
    W,
    B,  # (N,) weight, bias (HAS_W / HAS_B)
    MEAN,
    RSTD,  # (M,) saved by the forward (MEAN unused for RMS)
    C1,
    C2,  # (M,) row means of g*xhat and g (STATS_GIVEN, looped path)
    DX,  # (M, N) out
    DW_PART,
    DB_PART,  # (P, N) out, ACC: this program's column sums of dh*xhat and dh
    M,
    N,
    tiles_per_program,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_DS: tl.constexpr,
    STATS_GIVEN: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,
    PREFETCH: tl.constexpr,
    RELOAD_WB: tl.constexpr,
):
    """dx for BLOCK_M-row tiles pid, pid + P, pid + 2P, ... of column block program_id(1), and
    this program's partial dweight / dbias (summed over programs afterwards).

    Single-block path (STATS_GIVEN=False): a tile holds whole rows, so the row means c1, c2 are
    reduced here and x, dy are read once. Looped path: c1, c2 come from _norm_bwd_row_sums_kernel.
    x and dy of the next PREFETCH tiles (0, 1 or 2) are loaded before this tile is computed, so
    a program keeps loads in flight while it computes. RELOAD_WB reads weight and bias (L1/L2
    hits) in every tile instead of holding them in registers: fewer registers, more programs.
    """
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK_M
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if not RELOAD_WB:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)[None, :] if HAS_W else 1.0
        b = tl.load(B + cols, mask=col_ok, other=0.0).to(ACC)[None, :] if HAS_B else 0.0
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    if PREFETCH >= 1:
        offs, mask = _tile(rows, cols, M, N)
        x_next = tl.load(X + offs, mask=mask, other=0.0)
        dy_next = tl.load(DY + offs, mask=mask, other=0.0)
    if PREFETCH == 2:
        offs, mask = _tile(rows + step, cols, M, N)
        x_next2 = tl.load(X + offs, mask=mask, other=0.0)
        dy_next2 = tl.load(DY + offs, mask=mask, other=0.0)
    for _ in range(tiles_per_program):
        offs, mask = _tile(rows, cols, M, N)
        if PREFETCH == 0:
            x = tl.load(X + offs, mask=mask, other=0.0).to(ACC)
            dy = tl.load(DY + offs, mask=mask, other=0.0).to(ACC)
        else:
            x = x_next.to(ACC)
            dy = dy_next.to(ACC)
            ahead_offs, ahead_mask = _tile(rows + PREFETCH * step, cols, M, N)
            if PREFETCH == 2:
                x_next = x_next2
                dy_next = dy_next2
                x_next2 = tl.load(X + ahead_offs, mask=ahead_mask, other=0.0)
                dy_next2 = tl.load(DY + ahead_offs, mask=ahead_mask, other=0.0)
            else:
                x_next = tl.load(X + ahead_offs, mask=ahead_mask, other=0.0)
                dy_next = tl.load(DY + ahead_offs, mask=ahead_mask, other=0.0)
        if HAS_DS:
            ds = tl.load(DS + offs, mask=mask, other=0.0)
        if RELOAD_WB:
            w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)[None, :] if HAS_W else 1.0
            b = tl.load(B + cols, mask=col_ok, other=0.0).to(ACC)[None, :] if HAS_B else 0.0

        row_ok = rows < M
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)[:, None]
        if IS_RMS:
            xhat = x * rstd
        else:
            mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)[:, None]
            xhat = (x - mean) * rstd
            if not EVEN_N:  # padding columns must not enter the row sums
                xhat = tl.where(mask, xhat, 0.0)
        dh, g = _grads_at(xhat, dy, w, b, ACT, FAST, HAS_W, HAS_B)
        dw_acc += dh * xhat
        db_acc += dh
        if STATS_GIVEN:
            c1 = tl.load(C1 + rows, mask=row_ok, other=0.0)[:, None]
            c2 = tl.load(C2 + rows, mask=row_ok, other=0.0)[:, None]
        else:
            c1 = (tl.sum(g * xhat, axis=1) / N)[:, None]
            c2 = (tl.sum(g, axis=1) / N)[:, None]
        dx = g - xhat * c1
        if not IS_RMS:
            dx -= c2
        dx *= rstd
        if HAS_DS:
            dx += ds.to(ACC)
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        rows += step
    part = pid.to(tl.int64) * N + cols
    if HAS_W:
        tl.store(DW_PART + part, tl.sum(dw_acc, axis=0), mask=col_ok)
    if HAS_B:
        tl.store(DB_PART + part, tl.sum(db_acc, axis=0), mask=col_ok)


@triton.jit
def _norm_bwd_row_sums_kernel(
    DY,
    X,
    W,
    B,
    MEAN,
    RSTD,  # as in _norm_bwd_kernel
    C1,
    C2,  # (M,) out, ACC: row means of g*xhat and of g, g = dL/dxhat
    N,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Looped path, step 1: the two row reductions dx needs, one row per program."""
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    cols = tl.arange(0, BLOCK_N)
    rstd = tl.load(RSTD + row)
    mean = 0.0 if IS_RMS else tl.load(MEAN + row)
    acc1 = tl.zeros([BLOCK_N], dtype=ACC)
    acc2 = tl.zeros([BLOCK_N], dtype=ACC)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        m = c < N
        x = tl.load(X + base + c, mask=m, other=0.0).to(ACC)
        dy = tl.load(DY + base + c, mask=m, other=0.0).to(ACC)
        w = tl.load(W + c, mask=m, other=0.0).to(ACC) if HAS_W else 1.0
        b = tl.load(B + c, mask=m, other=0.0).to(ACC) if HAS_B else 0.0
        xhat = tl.where(m, (x - mean) * rstd, 0.0)
        _, g = _grads_at(xhat, dy, w, b, ACT, FAST, HAS_W, HAS_B)
        acc1 += g * xhat
        acc2 += g
    tl.store(C1 + row, tl.sum(acc1, axis=0) / N)
    tl.store(C2 + row, tl.sum(acc2, axis=0) / N)


@triton.jit
def _sum_partials_kernel(
    DW_PART,
    DB_PART,  # (P, N) per-program column sums, ACC
    DW,
    DB,  # (N,) out, in the weight's / bias's dtype
    P,
    N,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dweight and dbias from the backward's partials, in one launch and a fixed order (so the
    result is deterministic), cast once to the parameters' dtype."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    dw = tl.zeros([BLOCK_P, BLOCK_N], dtype=ACC)
    db = tl.zeros([BLOCK_P, BLOCK_N], dtype=ACC)
    for start in range(0, P, BLOCK_P):
        parts = start + tl.arange(0, BLOCK_P)
        offs, mask = _tile(parts, cols, P, N)
        if HAS_W:
            dw += tl.load(DW_PART + offs, mask=mask, other=0.0)
        if HAS_B:
            db += tl.load(DB_PART + offs, mask=mask, other=0.0)
    if HAS_W:
        tl.store(DW + cols, tl.sum(dw, axis=0).to(DW.dtype.element_ty), mask=col_ok)
    if HAS_B:
        tl.store(DB + cols, tl.sum(db, axis=0).to(DB.dtype.element_ty), mask=col_ok)
