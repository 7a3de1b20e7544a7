"""Triton kernels of dropout_add_layer_norm: y = LayerNorm(dropout(x) + residual).

Tiles are (BLOCK_M rows, GROUPS column groups, 8 lanes), the layout of the attention kernels'
Philox draws (`attention/_philox.py`): one Philox-4x32 call decides the 8 columns of a group, so
the generator's integer work stays under the memory time of a bf16 row. (Inductor's generated
dropout in torch 2.11 runs one Philox call per element and keeps one of its four words: BERT-base's
compiled dropout + add + LayerNorm forward ran at about a third of the copy rate on an H100.)

Rows fit one tile (N <= MAX_N), so a row is read once and written once each way:
- forward: reads x and residual, writes s = dropout(x) + residual (the backward's input, in x's
  dtype, rounded as PyTorch rounds the dropout and the add), y, and per-row mean and rstd;
- backward (persistent: each program walks tiles pid, pid + P, ...): reads dy and s, writes the
  residual's gradient dsum and x's gradient keep * dsum / (1 - p) (the mask regenerated from
  the seed, never stored), and the program's column sums for dweight and dbias, which
  `_sum_partials_kernel` adds in a fixed order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..attention._philox import dropout_keep, seed_key

LANES = 8  # columns one Philox call decides


@triton.jit
def _tile3(rows, groups, lanes, M, N):
    """Offsets (int64) and mask of the (rows, groups, lanes) tile of an (M, N) row-major tensor."""
    cols = groups * 8 + lanes
    mask = (rows < M) & (cols < N)
    return rows.to(tl.int64) * N + cols, mask


@triton.jit
def _row_sum(t):
    """(BLOCK_M, GROUPS, 8) -> (BLOCK_M, 1, 1)."""
    return tl.sum(tl.sum(t, axis=2), axis=1)[:, None, None]


@triton.jit
def _dropout_add_ln_fwd_kernel(
    X,  # (M, N) input of the dropout
    R,  # (M, N) residual
    S,  # (M, N) out: dropout(x) + residual, x's dtype
    Y,  # (M, N) out: LayerNorm(s) * W + B
    W,  # (N,) weight (HAS_W)
    B,  # (N,) bias (HAS_B)
    MEAN,  # (M,) out, ACC
    RSTD,  # (M,) out, ACC
    SEED,  # (1,) int64 Philox key (DROP)
    M,
    N,
    eps,
    threshold,  # 16-bit draws below it are dropped
    keep_scale,  # 1 / (1 - p)
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROP: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    GROUPS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None, None]  # (BM, 1, 1)
    groups = tl.arange(0, GROUPS)[None, :, None]  # (1, G, 1)
    lanes = tl.arange(0, 8)[None, None, :]  # (1, 1, 8)
    offs, mask = _tile3(rows, groups, lanes, M, N)
    x = tl.load(X + offs, mask=mask, other=0.0).to(ACC)
    r = tl.load(R + offs, mask=mask, other=0.0).to(ACC)
    if DROP:
        k0, k1 = seed_key(SEED)
        keep = dropout_keep(k0, k1, rows, groups, lanes, threshold)
        # PyTorch's dropout rounds x / (1 - p) to x's dtype before the add
        x = tl.where(keep, (x * keep_scale).to(X.dtype.element_ty).to(ACC), 0.0)
    s = (x + r).to(S.dtype.element_ty)
    tl.store(S + offs, s, mask=mask)
    s = s.to(ACC)
    mean = _row_sum(s) / N  # (BM, 1, 1)
    xc = tl.where(mask, s - mean, 0.0)
    rstd = tl.rsqrt(_row_sum(xc * xc) / N + eps)  # two passes over registers: no cancellation
    row_ok = rows < M
    tl.store(MEAN + rows, mean, mask=row_ok)
    tl.store(RSTD + rows, rstd, mask=row_ok)
    cols = groups * 8 + lanes
    col_ok = cols < N
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)
    if HAS_B:
        y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(ACC)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _dropout_add_ln_bwd_kernel(
    DY,  # (M, N) gradient of y
    S,  # (M, N) the forward's s
    W,  # (N,) weight (HAS_W)
    MEAN,
    RSTD,  # (M,) the forward's statistics
    SEED,  # (1,) int64 (DROP)
    DRES,  # (M, N) out: gradient of s, which is the residual's
    DX,  # (M, N) out: gradient of x, keep * DRES * keep_scale (DROP)
    DW_PART,
    DB_PART,  # (P, N) out, ACC: this program's column sums of dy * xhat and of dy
    M,
    N,
    tiles_per_program,
    threshold,
    keep_scale,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROP: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    GROUPS: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK_M
    groups = tl.arange(0, GROUPS)[None, :, None]
    lanes = tl.arange(0, 8)[None, None, :]
    cols = groups * 8 + lanes  # (1, G, 8)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC) if HAS_W else 1.0
    if DROP:
        k0, k1 = seed_key(SEED)
    dw_acc = tl.zeros([BLOCK_M, GROUPS, 8], dtype=ACC)
    db_acc = tl.zeros([BLOCK_M, GROUPS, 8], dtype=ACC)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)[:, None, None]
    for _ in range(tiles_per_program):
        offs, mask = _tile3(rows, groups, lanes, M, N)
        row_ok = rows < M
        s = tl.load(S + offs, mask=mask, other=0.0).to(ACC)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(ACC)
        mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (s - mean) * rstd, 0.0)
        dw_acc += dy * xhat
        db_acc += dy
        g = dy * w
        c1 = _row_sum(g * xhat) / N
        c2 = _row_sum(g) / N
        dsum = ((g - xhat * c1 - c2) * rstd).to(DRES.dtype.element_ty)
        tl.store(DRES + offs, dsum, mask=mask)
        if DROP:
            keep = dropout_keep(k0, k1, rows, groups, lanes, threshold)
            dx = tl.where(keep, dsum.to(ACC) * keep_scale, 0.0)
            tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        rows += step
    part = pid.to(tl.int64) * N + (tl.arange(0, GROUPS)[:, None] * 8 + tl.arange(0, 8)[None, :])
    part_ok = (tl.arange(0, GROUPS)[:, None] * 8 + tl.arange(0, 8)[None, :]) < N
    if HAS_W:
        tl.store(DW_PART + part, tl.sum(dw_acc, axis=0), mask=part_ok)
    if HAS_B:
        tl.store(DB_PART + part, tl.sum(db_acc, axis=0), mask=part_ok)
