"""Triton kernels of batch_norm_act's backward: the elementwise pass of training, which reads
dy, x and the ReLU mask bits once more and writes dx (and d_residual) from the sums the reduction
pass left (`_bwd_kernels.py`, where the formulas are; layout conventions: `_kernels.py`):
  dx = a * (dz - sum(dz)/M - x_hat * sum(dz * x_hat)/M), a = w * rstd.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._tile_math import _bits_offsets, _block_at, _channel_params, _tile_offsets, _unpack_bits


@triton.jit
def _load_block(
    dy_ptr,
    x_ptr,
    bits_ptr,
    rb,
    valid,
    cb,
    c_off,
    offs,
    cmask,
    C,
    L,
    NB,
    RELU: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    """dy, x and the packed mask bytes of row block rb >= 0 (zeros where it is not `valid`)."""
    base, row0, rmask = _block_at(rb, valid, C, L, BLOCK_L, CHANNELS_LAST)
    m = rmask[:, None] & cmask[None, :]
    dy = tl.load(dy_ptr + base + c_off + offs, mask=m, other=0.0)
    x = tl.load(x_ptr + base + c_off + offs, mask=m, other=0.0)
    if RELU:
        byte = cb * (BLOCK_C // 8) + tl.arange(0, BLOCK_C // 8)
        bm = rmask[:, None] & (byte < NB)[None, :]
        packed = tl.load(
            bits_ptr + row0 * NB + cb * (BLOCK_C // 8) + _bits_offsets(NB, BLOCK_L, BLOCK_C),
            mask=bm,
            other=0,
        )
    else:
        packed = tl.zeros((BLOCK_L, BLOCK_C // 8), tl.uint8)
    return dy, x, packed


@triton.jit
def _dx_tile(
    dy,
    x,
    packed,
    rb,
    dx_ptr,
    dres_ptr,
    mean,
    a,
    mean_dz,
    k_x,
    c_off,
    offs,
    cmask,
    C,
    L,
    HAS_RES: tl.constexpr,
    RELU: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    """dx (and d_residual) of row block rb from its loaded dy, x and mask bytes."""
    dz = dy.to(mean.dtype)
    if RELU:
        dz = tl.where(_unpack_bits(packed, BLOCK_L, BLOCK_C), dz, 0.0)
    xm = x.to(mean.dtype) - mean[None, :]
    dx = a[None, :] * (dz - mean_dz[None, :] - xm * k_x[None, :])
    base, _, rmask = _block_at(rb, True, C, L, BLOCK_L, CHANNELS_LAST)
    m = rmask[:, None] & cmask[None, :]
    tl.store(dx_ptr + base + c_off + offs, dx.to(dx_ptr.dtype.element_ty), mask=m)
    if HAS_RES:
        tl.store(dres_ptr + base + c_off + offs, dz.to(dres_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["NB", "n_rb", "G", "M"])  # NB: "Mask bytes", _batch_norm_kernels
def _bwd_apply_kernel(
    dy_ptr,
    x_ptr,  # (O, L, C) views: output gradient and the forward input
    bits_ptr,  # (N*H*W, NB) uint8 ReLU mask bits (RELU)
    mean_ptr,
    rstd_ptr,  # (C,) batch statistics
    w_ptr,  # (C,) weight (HAS_W)
    dw_ptr,
    db_ptr,  # (C,) sum(dz * x_hat) and sum(dz) from the reduction
    dx_ptr,
    dres_ptr,  # (O, L, C) out: input gradient, residual gradient (HAS_RES)
    C,
    L,
    NB,
    n_rb,
    G,
    M,
    HAS_W: tl.constexpr,
    HAS_RES: tl.constexpr,
    RELU: tl.constexpr,
    LOOP: tl.constexpr,
    PREFETCH: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    # read dy, x, mask bits; write dx (+ dres). Programs, order, LOOP and PREFETCH as
    # _apply_kernel (row blocks from the end: the reduction read the tail last, still in L2).
    pid = tl.program_id(0)
    n_cb = tl.cdiv(C, BLOCK_C)
    cb = pid % n_cb
    j = pid // n_cb
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    offs, s_c = _tile_offsets(C, L, BLOCK_L, BLOCK_C, CHANNELS_LAST)
    c_off = (cb * BLOCK_C).to(tl.int64) * s_c
    # the first tile's loads go first, so they are in flight while the channel vectors arrive
    dy, x, packed = _load_block(
        dy_ptr,
        x_ptr,
        bits_ptr,
        n_rb - 1 - j,
        True,
        cb,
        c_off,
        offs,
        cmask,
        C,
        L,
        NB,
        RELU,
        BLOCK_L,
        BLOCK_C,
        CHANNELS_LAST,
    )
    mean, rstd, w = _channel_params(mean_ptr, rstd_ptr, w_ptr, cols, cmask, 0.0, False, HAS_W)
    n = tl.zeros((), mean.dtype) + M
    a = w * rstd
    mean_dz = tl.load(db_ptr + cols, mask=cmask, other=0.0) / n
    k_x = rstd * tl.load(dw_ptr + cols, mask=cmask, other=0.0) / n  # x_hat-term per (x - mean)
    if LOOP:
        for i in range(j, n_rb, G):
            rb = n_rb - 1 - i
            nxt = tl.maximum(rb - G, 0)  # this program's next row block, when rb - G >= 0
            dy_now, x_now, packed_now = dy, x, packed
            if PREFETCH:
                dy, x, packed = _load_block(
                    dy_ptr,
                    x_ptr,
                    bits_ptr,
                    nxt,
                    rb >= G,
                    cb,
                    c_off,
                    offs,
                    cmask,
                    C,
                    L,
                    NB,
                    RELU,
                    BLOCK_L,
                    BLOCK_C,
                    CHANNELS_LAST,
                )
            _dx_tile(
                dy_now,
                x_now,
                packed_now,
                rb,
                dx_ptr,
                dres_ptr,
                mean,
                a,
                mean_dz,
                k_x,
                c_off,
                offs,
                cmask,
                C,
                L,
                HAS_RES,
                RELU,
                BLOCK_L,
                BLOCK_C,
                CHANNELS_LAST,
            )
            if not PREFETCH:
                dy, x, packed = _load_block(
                    dy_ptr,
                    x_ptr,
                    bits_ptr,
                    nxt,
                    rb >= G,
                    cb,
                    c_off,
                    offs,
                    cmask,
                    C,
                    L,
                    NB,
                    RELU,
                    BLOCK_L,
                    BLOCK_C,
                    CHANNELS_LAST,
                )
    else:
        _dx_tile(
            dy,
            x,
            packed,
            n_rb - 1 - j,
            dx_ptr,
            dres_ptr,
            mean,
            a,
            mean_dz,
            k_x,
            c_off,
            offs,
            cmask,
            C,
            L,
            HAS_RES,
            RELU,
            BLOCK_L,
            BLOCK_C,
            CHANNELS_LAST,
        )
