"""Triton kernels of batch_norm_act's backward for the smooth activations (SiLU, GELU,
Hardswish; ReLU's, which reads a saved mask: `_bwd_kernels.py`; layouts: `_kernels.py`).

dz = dy * act'(h) needs the pre-activation h = (x - mean) * rstd * w + b (+ residual). It is
recomputed from x, the saved statistics, weight and bias (and the residual, which the forward
saves a reference to): saving h instead would write one more tensor in the forward and read it
in both backward passes, and keep it alive until then. Per element, in passes over one tensor:
  no residual: sums read dy, x; the dx pass reads dy, x (recomputes dz) and writes dx     = 5
  residual:    sums read dy, x, residual and write dz, which *is* d_residual; the dx pass
               reads that dz and x and writes dx (`_bwd_apply_kernel` with no activation)  = 7
  eval: one pass, read dy, x (, residual), write dx (, d_residual)                     = 3 (5)
The sums add dz in fp32; the dx pass of a residual reads dz back as stored (in x's dtype, as
PyTorch's own backward does: its activation backward writes dz in x's dtype and the BatchNorm
backward reads it). Summing the stored dz instead would add its rounding to dweight and dbias:
a bias that grows with N*H*W where the rounding is not to nearest (Triton's interpreter
truncates fp32 -> bf16), for a consistency the dx formula does not need (M >= 2 rows).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._act_math import _act_grad
from ._bwd_kernels import _finish_sums
from ._tile_math import _block_at, _channel_params, _last_of_block, _tile_offsets


@triton.jit
def _act_dz(dy, x, res, mean, scale, bias, ACT: tl.constexpr, HAS_RES: tl.constexpr):
    """(dz, x - mean): h recomputed with the forward's own operations (`_apply_tile`)."""
    xm = x.to(mean.dtype) - mean[None, :]
    h = xm * scale[None, :] + bias[None, :]
    if HAS_RES:
        h += res.to(mean.dtype)
    return dy.to(mean.dtype) * _act_grad(h, ACT), xm


@triton.jit
def _channel_bias(b_ptr, cols, cmask, like, HAS_B: tl.constexpr):
    if HAS_B:
        return tl.load(b_ptr + cols, mask=cmask, other=0.0).to(like.dtype)
    else:
        return tl.zeros_like(like)


@triton.jit
def _act_bwd_block(
    dy_ptr,
    x_ptr,
    res_ptr,
    dx_ptr,
    dres_ptr,
    rb,
    rb_end,
    cmask,
    offs,
    c_off,
    mean,
    scale,
    bias,
    C,
    L,
    EVAL: tl.constexpr,
    HAS_RES: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_L: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    """dz and dz * (x - mean) of one row block (zero outside it); stores dz as d_residual
    (HAS_RES) and, in eval, dx."""
    base, _, rmask = _block_at(rb, rb < rb_end, C, L, BLOCK_L, CHANNELS_LAST)
    ptr_off = base + c_off + offs
    m = rmask[:, None] & cmask[None, :]
    dy = tl.load(dy_ptr + ptr_off, mask=m, other=0.0)
    x = tl.load(x_ptr + ptr_off, mask=m, other=0.0)
    res = x
    if HAS_RES:
        res = tl.load(res_ptr + ptr_off, mask=m, other=0.0)
    dz, xm = _act_dz(dy, x, res, mean, scale, bias, ACT, HAS_RES)
    if HAS_RES:
        tl.store(dres_ptr + ptr_off, dz.to(dres_ptr.dtype.element_ty), mask=m)
    if EVAL:
        tl.store(dx_ptr + ptr_off, (dz * scale[None, :]).to(dx_ptr.dtype.element_ty), mask=m)
    return dz, dz * xm


@triton.jit(do_not_specialize=["n_rb", "P"])  # one compiled kernel for every grid size
def _act_bwd_reduce_kernel(
    dy_ptr,
    x_ptr,
    res_ptr,  # (O, L, C) views: output gradient, forward input, residual (HAS_RES)
    mean_ptr,
    stat_ptr,  # (C,) mean; rstd, or running var in eval (STAT_IS_VAR = EVAL)
    w_ptr,
    b_ptr,  # (C,) weight (HAS_W) and bias (HAS_B)
    part_ptr,  # (2, P, C) out: per-program sum(dz), sum(dz * (x - mean))
    count_ptr,  # (n_cb,) int32, zero between launches (FUSED)
    dw_ptr,
    db_ptr,  # (C,) out (FUSED): dweight, dbias
    dx_ptr,  # (O, L, C) out in eval: dx = dz * w * rstd
    dres_ptr,  # (O, L, C) out (HAS_RES): d_residual = dz
    C,
    L,
    n_rb,
    P,
    eps,
    EVAL: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_RES: tl.constexpr,
    ACT: tl.constexpr,
    FUSED: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    # read dy, x (+ residual) once; write dz (HAS_RES) and, in eval, dx. Row blocks j, j + P, ...
    pid = tl.program_id(0)
    n_cb = tl.cdiv(C, BLOCK_C)
    cb = pid % n_cb
    j = pid // n_cb
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mean, rstd, w = _channel_params(mean_ptr, stat_ptr, w_ptr, cols, cmask, eps, EVAL, HAS_W)
    scale = rstd * w
    bias = _channel_bias(b_ptr, cols, cmask, mean, HAS_B)
    offs, s_c = _tile_offsets(C, L, BLOCK_L, BLOCK_C, CHANNELS_LAST)
    c_off = (cb * BLOCK_C).to(tl.int64) * s_c
    acc_dz = tl.zeros((BLOCK_L, BLOCK_C), mean.dtype)
    acc_dzx = tl.zeros((BLOCK_L, BLOCK_C), mean.dtype)
    for rb in range(j, n_rb, 2 * P):  # two blocks a trip: both loads in flight together
        dz0, dzx0 = _act_bwd_block(
            dy_ptr,
            x_ptr,
            res_ptr,
            dx_ptr,
            dres_ptr,
            rb,
            n_rb,
            cmask,
            offs,
            c_off,
            mean,
            scale,
            bias,
            C,
            L,
            EVAL,
            HAS_RES,
            ACT,
            BLOCK_L,
            CHANNELS_LAST,
        )
        dz1, dzx1 = _act_bwd_block(
            dy_ptr,
            x_ptr,
            res_ptr,
            dx_ptr,
            dres_ptr,
            rb + P,
            n_rb,
            cmask,
            offs,
            c_off,
            mean,
            scale,
            bias,
            C,
            L,
            EVAL,
            HAS_RES,
            ACT,
            BLOCK_L,
            CHANNELS_LAST,
        )
        acc_dz += dz0 + dz1
        acc_dzx += dzx0 + dzx1
    tl.store(part_ptr + j * C + cols, tl.sum(acc_dz, axis=0), mask=cmask)
    tl.store(part_ptr + (P + j) * C + cols, tl.sum(acc_dzx, axis=0), mask=cmask)
    if FUSED:  # noqa: SIM102 (a static if: the atomic must not be emitted unless FUSED)
        if _last_of_block(count_ptr, cb, P):
            _finish_sums(part_ptr, cols, cmask, C, P, rstd, dw_ptr, db_ptr, BLOCK_P, BLOCK_C)


@triton.jit
def _act_dx_block(
    dy_ptr,
    x_ptr,
    dx_ptr,
    rb,
    c_off,
    offs,
    cmask,
    mean,
    scale,
    bias,
    mean_dz,
    k_x,
    C,
    L,
    ACT: tl.constexpr,
    BLOCK_L: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    """dx of row block rb >= 0: dz recomputed from dy and x (no residual)."""
    base, _, rmask = _block_at(rb, True, C, L, BLOCK_L, CHANNELS_LAST)
    ptr_off = base + c_off + offs
    m = rmask[:, None] & cmask[None, :]
    dy = tl.load(dy_ptr + ptr_off, mask=m, other=0.0)
    x = tl.load(x_ptr + ptr_off, mask=m, other=0.0)
    dz, xm = _act_dz(dy, x, x, mean, scale, bias, ACT, False)
    dx = scale[None, :] * (dz - mean_dz[None, :] - xm * k_x[None, :])
    tl.store(dx_ptr + ptr_off, dx.to(dx_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_rb", "G", "M"])
def _act_bwd_apply_kernel(
    dy_ptr,
    x_ptr,  # (O, L, C) views: output gradient and the forward input
    mean_ptr,
    rstd_ptr,  # (C,) batch statistics
    w_ptr,
    b_ptr,  # (C,) weight (HAS_W) and bias (HAS_B)
    dw_ptr,
    db_ptr,  # (C,) sum(dz * x_hat) and sum(dz) from the reduction
    dx_ptr,  # (O, L, C) out: input gradient
    C,
    L,
    n_rb,
    G,
    M,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    ACT: tl.constexpr,
    LOOP: tl.constexpr,
    PREFETCH: tl.constexpr,  # taken for the shared plans (`_plans._elementwise`); not used here
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    # training without a residual: read dy, x; write dx. Programs and order as _bwd_apply_kernel
    # (LOOP: G programs a channel block, each doing row blocks j, j + G, ... from the end).
    pid = tl.program_id(0)
    n_cb = tl.cdiv(C, BLOCK_C)
    cb = pid % n_cb
    j = pid // n_cb
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    offs, s_c = _tile_offsets(C, L, BLOCK_L, BLOCK_C, CHANNELS_LAST)
    c_off = (cb * BLOCK_C).to(tl.int64) * s_c
    mean, rstd, w = _channel_params(mean_ptr, rstd_ptr, w_ptr, cols, cmask, 0.0, False, HAS_W)
    scale = rstd * w
    bias = _channel_bias(b_ptr, cols, cmask, mean, HAS_B)
    n = tl.zeros((), mean.dtype) + M
    mean_dz = tl.load(db_ptr + cols, mask=cmask, other=0.0) / n
    k_x = rstd * tl.load(dw_ptr + cols, mask=cmask, other=0.0) / n  # x_hat-term per (x - mean)
    if LOOP:
        for i in range(j, n_rb, G):
            _act_dx_block(
                dy_ptr,
                x_ptr,
                dx_ptr,
                n_rb - 1 - i,
                c_off,
                offs,
                cmask,
                mean,
                scale,
                bias,
                mean_dz,
                k_x,
                C,
                L,
                ACT,
                BLOCK_L,
                CHANNELS_LAST,
            )
    else:
        _act_dx_block(
            dy_ptr,
            x_ptr,
            dx_ptr,
            n_rb - 1 - j,
            c_off,
            offs,
            cmask,
            mean,
            scale,
            bias,
            mean_dz,
            k_x,
            C,
            L,
            ACT,
            BLOCK_L,
            CHANNELS_LAST,
        )
