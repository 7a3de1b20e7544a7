"""Triton kernels of batch_norm_act's backward: the reduction pass and its finalize (the
elementwise dx pass in `_bwd_apply_kernels.py`; layout conventions: `_kernels.py`).

With dz = dy * [y > 0] (ReLU) or dy, x_hat = (x - mean) * rstd and a = w * rstd:
  training: dx = a * (dz - sum(dz)/M - x_hat * sum(dz * x_hat)/M)   (statistics depend on x)
  eval:     dx = a * dz
  dweight = sum(dz * x_hat), dbias = sum(dz), d_residual = dz, sums over the M = N*H*W rows.
Training takes two passes over the tensors: a reduction (read dy, x, mask bits) and an elementwise
pass (read dy, x, mask bits; write dx, d_residual). Eval takes one: the reduction writes dx too.
With a second output gradient (HAS_DY2: the output's gradient arrives in two parts, dy + dy2, a
ResNet block's output feeding the next block's convolution and its residual add; see `_ops.py`)
the reduction reads both and, in training, writes dz (WRITE_DZ), which the elementwise pass then
reads in place of dy and the mask: 7 passes where adding dy + dy2 first took 9.
The reduction's partial sums are added by its last program per channel block (FUSED) or by a
finalize kernel, as in the forward (see `_kernels.py`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._tile_math import (
    _bits_offsets,
    _block_at,
    _channel_params,
    _last_of_block,
    _sum_partials,
    _tile_offsets,
    _unpack_bits,
)


@triton.jit
def _load_dz(
    dy_ptr,
    dy2_ptr,
    bits_ptr,
    ptr_off,
    m,
    bits_off,
    bm,
    acc_ty: tl.constexpr,
    HAS_DY2: tl.constexpr,
    RELU: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    dy = tl.load(dy_ptr + ptr_off, mask=m, other=0.0).to(acc_ty)
    if HAS_DY2:  # the output's gradient in two parts, added in fp32
        dy += tl.load(dy2_ptr + ptr_off, mask=m, other=0.0).to(acc_ty)
    if RELU:
        packed = tl.load(bits_ptr + bits_off, mask=bm, other=0)
        dy = tl.where(_unpack_bits(packed, BLOCK_L, BLOCK_C), dy, 0.0)
    return dy


@triton.jit
def _bwd_block(
    dy_ptr,
    dy2_ptr,
    x_ptr,
    bits_ptr,
    dx_ptr,
    dres_ptr,
    dz_ptr,
    rb,
    rb_end,
    cb,
    cmask,
    offs,
    c_off,
    mean,
    scale,
    C,
    L,
    NB,
    EVAL: tl.constexpr,
    HAS_RES: tl.constexpr,
    RELU: tl.constexpr,
    HAS_DY2: tl.constexpr,
    WRITE_DZ: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    """dz and dz * (x - mean) of one row block (zero outside it); in eval also writes dx, dres;
    with WRITE_DZ, dz."""
    base, row0, rmask = _block_at(rb, rb < rb_end, C, L, BLOCK_L, CHANNELS_LAST)
    ptr_off = base + c_off + offs
    m = rmask[:, None] & cmask[None, :]
    byte = cb * (BLOCK_C // 8) + tl.arange(0, BLOCK_C // 8)
    bm = rmask[:, None] & (byte < NB)[None, :]
    bits_off = row0 * NB + cb * (BLOCK_C // 8) + _bits_offsets(NB, BLOCK_L, BLOCK_C)
    dz = _load_dz(
        dy_ptr,
        dy2_ptr,
        bits_ptr,
        ptr_off,
        m,
        bits_off,
        bm,
        mean.dtype,
        HAS_DY2,
        RELU,
        BLOCK_L,
        BLOCK_C,
    )
    x = tl.load(x_ptr + ptr_off, mask=m, other=0.0).to(mean.dtype)
    if WRITE_DZ:
        tl.store(dz_ptr + ptr_off, dz.to(dz_ptr.dtype.element_ty), mask=m)
    if EVAL:
        tl.store(dx_ptr + ptr_off, (dz * scale[None, :]).to(dx_ptr.dtype.element_ty), mask=m)
        if HAS_RES:
            tl.store(dres_ptr + ptr_off, dz.to(dres_ptr.dtype.element_ty), mask=m)
    return dz, dz * (x - mean[None, :])


@triton.jit
def _finish_sums(
    part_ptr, cols, cmask, C, P, rstd, dw_ptr, db_ptr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr
):
    """dweight = sum(dz * (x - mean)) * rstd and dbias = sum(dz) from the (2, P, C) partials."""
    sum_dz = _sum_partials(part_ptr, 0, P, C, cols, cmask, rstd.dtype, BLOCK_P, BLOCK_C)
    sum_dzx = _sum_partials(part_ptr, P, P, C, cols, cmask, rstd.dtype, BLOCK_P, BLOCK_C)
    tl.store(dw_ptr + cols, sum_dzx * rstd, mask=cmask)
    tl.store(db_ptr + cols, sum_dz, mask=cmask)


@triton.jit(do_not_specialize=["NB", "n_rb", "P"])  # as _apply_kernel and _stats_kernel
def _bwd_reduce_kernel(
    dy_ptr,
    dy2_ptr,  # (O, L, C) view: the output gradient's second part (HAS_DY2)
    x_ptr,  # (O, L, C) views: output gradient and the forward input
    bits_ptr,  # (N*H*W, NB) uint8 ReLU mask bits from the forward (RELU)
    mean_ptr,
    stat_ptr,  # (C,) mean; rstd, or running var in eval (STAT_IS_VAR = EVAL)
    w_ptr,  # (C,) weight (HAS_W)
    part_ptr,  # (2, P, C) out: per-program sum(dz), sum(dz * (x - mean))
    count_ptr,  # (n_cb,) int32, zero between launches (FUSED)
    dw_ptr,
    db_ptr,  # (C,) out (FUSED): dweight, dbias
    dx_ptr,
    dres_ptr,  # EVAL only: dx = dz * w * rstd and d_residual = dz
    dz_ptr,  # (O, L, C) out (WRITE_DZ): dz, for the elementwise pass
    C,
    L,
    NB,
    n_rb,
    P,
    eps,
    EVAL: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_RES: tl.constexpr,
    RELU: tl.constexpr,
    HAS_DY2: tl.constexpr,
    WRITE_DZ: tl.constexpr,
    FUSED: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    # read dy (dy2), x and mask bits once (eval: also write dx, dres; WRITE_DZ: dz); row blocks
    # j, j + P, ...
    pid = tl.program_id(0)
    n_cb = tl.cdiv(C, BLOCK_C)
    cb = pid % n_cb
    j = pid // n_cb
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mean, rstd, w = _channel_params(mean_ptr, stat_ptr, w_ptr, cols, cmask, eps, EVAL, HAS_W)
    scale = rstd * w
    offs, s_c = _tile_offsets(C, L, BLOCK_L, BLOCK_C, CHANNELS_LAST)
    c_off = (cb * BLOCK_C).to(tl.int64) * s_c
    acc_dz = tl.zeros((BLOCK_L, BLOCK_C), mean.dtype)
    acc_dzx = tl.zeros((BLOCK_L, BLOCK_C), mean.dtype)
    for rb in range(j, n_rb, 2 * P):
        dz0, dzx0 = _bwd_block(
            dy_ptr,
            dy2_ptr,
            x_ptr,
            bits_ptr,
            dx_ptr,
            dres_ptr,
            dz_ptr,
            rb,
            n_rb,
            cb,
            cmask,
            offs,
            c_off,
            mean,
            scale,
            C,
            L,
            NB,
            EVAL,
            HAS_RES,
            RELU,
            HAS_DY2,
            WRITE_DZ,
            BLOCK_L,
            BLOCK_C,
            CHANNELS_LAST,
        )
        dz1, dzx1 = _bwd_block(
            dy_ptr,
            dy2_ptr,
            x_ptr,
            bits_ptr,
            dx_ptr,
            dres_ptr,
            dz_ptr,
            rb + P,
            n_rb,
            cb,
            cmask,
            offs,
            c_off,
            mean,
            scale,
            C,
            L,
            NB,
            EVAL,
            HAS_RES,
            RELU,
            HAS_DY2,
            WRITE_DZ,
            BLOCK_L,
            BLOCK_C,
            CHANNELS_LAST,
        )
        acc_dz += dz0 + dz1
        acc_dzx += dzx0 + dzx1
    tl.store(part_ptr + j * C + cols, tl.sum(acc_dz, axis=0), mask=cmask)
    tl.store(part_ptr + (P + j) * C + cols, tl.sum(acc_dzx, axis=0), mask=cmask)
    if FUSED:  # noqa: SIM102 (a static if: the atomic must not be emitted unless FUSED)
        if _last_of_block(count_ptr, cb, P):
            _finish_sums(part_ptr, cols, cmask, C, P, rstd, dw_ptr, db_ptr, BLOCK_P, BLOCK_C)


@triton.jit(do_not_specialize=["P"])
def _bwd_finalize_kernel(
    part_ptr,  # (2, P, C) partials from _bwd_reduce_kernel
    mean_ptr,
    stat_ptr,  # (C,) mean; rstd, or running var when STAT_IS_VAR
    dw_ptr,
    db_ptr,  # (C,) out: dweight = sum(dz * x_hat), dbias = sum(dz)
    C,
    P,
    eps,
    STAT_IS_VAR: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    _, rstd, _ = _channel_params(mean_ptr, stat_ptr, mean_ptr, cols, cmask, eps, STAT_IS_VAR, False)
    _finish_sums(part_ptr, cols, cmask, C, P, rstd, dw_ptr, db_ptr, BLOCK_P, BLOCK_C)
