"""The pieces batch_norm_act's forward and backward kernels share: the (O, L, C) view's row
blocks and tile offsets, the ReLU mask's bit packing, per-channel parameters, the deterministic
two-stage partial sums and the last-program test (conventions: `_kernels.py`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _block_at(rb, valid, C, L, BLOCK_L: tl.constexpr, CHANNELS_LAST: tl.constexpr):
    """Row block rb: (element offset of its first row, its flat row o*L + l0, which rows exist)."""
    if CHANNELS_LAST:  # O = 1: no division
        l0 = rb * BLOCK_L
        row0 = l0.to(tl.int64)
        base = row0 * C
    else:
        n_lb = tl.cdiv(L, BLOCK_L)
        o = rb // n_lb
        l0 = (rb - o * n_lb) * BLOCK_L
        row0 = o.to(tl.int64) * L + l0
        base = o.to(tl.int64) * C * L + l0
    rows = l0 + tl.arange(0, BLOCK_L)
    # (a where, not `& valid`: the interpreter mis-types bool & scalar bool)
    return base, row0, rows < tl.where(valid, L, 0)


@triton.jit
def _tile_offsets(C, L, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr, CHANNELS_LAST: tl.constexpr):
    """(BLOCK_L, BLOCK_C) element offsets inside a row block, and the channel block's own offset
    multiplier (the stride of C)."""
    rows = tl.arange(0, BLOCK_L)[:, None]
    lc = tl.arange(0, BLOCK_C)[None, :]
    if CHANNELS_LAST:
        return rows * C + lc, 1
    else:
        return rows + lc * L, L


@triton.jit
def _bits_offsets(NB, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """(BLOCK_L, BLOCK_C // 8) byte offsets of a row block's mask bytes, from its first byte."""
    return tl.arange(0, BLOCK_L)[:, None] * NB + tl.arange(0, BLOCK_C // 8)[None, :]


@triton.jit
def _pack_bits(pos, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """(BLOCK_L, BLOCK_C) bool -> (BLOCK_L, BLOCK_C // 8) uint8; bit k of byte j is column 8j+k."""
    bits = tl.reshape(pos.to(tl.int32), (BLOCK_L, BLOCK_C // 8, 8))
    weights = tl.full((8,), 1, tl.int32) << tl.arange(0, 8)
    return tl.sum(bits * weights[None, None, :], axis=2).to(tl.uint8)


@triton.jit
def _unpack_bits(packed, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """Inverse of _pack_bits: (BLOCK_L, BLOCK_C // 8) uint8 -> (BLOCK_L, BLOCK_C) bool."""
    bits = (packed.to(tl.int32)[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1
    return tl.reshape(bits, (BLOCK_L, BLOCK_C)) != 0


@triton.jit
def _inv_sqrt(v):
    """1/sqrt(v), correctly rounded sqrt (tl.sqrt is approximate in fp32; sqrt_rn is fp32-only)."""
    if v.dtype == tl.float64:
        return 1.0 / tl.sqrt(v)
    else:
        return 1.0 / tl.sqrt_rn(v)


@triton.jit
def _channel_params(
    mean_ptr, stat_ptr, w_ptr, cols, cmask, eps, STAT_IS_VAR: tl.constexpr, HAS_W: tl.constexpr
):
    """Per-channel mean, rstd and weight in the statistics dtype (fp32, or fp64 for fp64 input)."""
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0)
    acc_ty = mean.dtype
    stat = tl.load(stat_ptr + cols, mask=cmask, other=1.0).to(acc_ty)
    rstd = _inv_sqrt(stat + eps) if STAT_IS_VAR else stat
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(acc_ty)
    else:
        w = tl.full(cols.shape, 1.0, acc_ty)
    return mean, rstd, w


@triton.jit
def _shifted_tile(
    x_ptr,
    rb,
    rb_end,
    c_off,
    offs,
    cmask,
    shift_x,
    shift,
    C,
    L,
    BLOCK_L: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    """x - K over one row block; 0 outside it (masked lanes load K itself: no select needed)."""
    base, _, rmask = _block_at(rb, rb < rb_end, C, L, BLOCK_L, CHANNELS_LAST)
    m = rmask[:, None] & cmask[None, :]
    x = tl.load(x_ptr + base + c_off + offs, mask=m, other=shift_x[None, :])
    return x.to(shift.dtype) - shift[None, :]


@triton.jit
def _sum_partials(
    part_ptr,
    row0,
    P,
    C,
    cols,
    cmask,
    acc_ty: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Column sums of part[row0 : row0 + P, cols] in a fixed order (deterministic)."""
    acc = tl.zeros((BLOCK_P, BLOCK_C), acc_ty)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        m = (p < P)[:, None] & cmask[None, :]
        acc += tl.load(
            part_ptr + (row0 + p)[:, None] * C + cols[None, :],
            mask=m,
            other=0.0,
            cache_modifier=".cg",
        )
    return tl.sum(acc, axis=0)


@triton.jit
def _last_of_block(count_ptr, cb, P):
    """True in the last of the P programs of channel block cb to get here (all threads' earlier
    stores are then visible to it); that program resets the count for the next launch."""
    tl.debug_barrier()  # every thread's partial stores come before the release below
    last = tl.atomic_add(count_ptr + cb, 1, sem="acq_rel") == P - 1
    if last:
        tl.store(count_ptr + cb, 0)
    return last


@triton.jit
def _finish_stats(
    part_ptr,
    cols,
    cmask,
    C,
    P,
    M,
    eps,
    momentum,
    mean_ptr,
    rstd_ptr,
    rmean_ptr,
    rvar_ptr,
    UPDATE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """mean, rstd (and the running stats) of channels `cols` from the (2P + 1, C) partials."""
    acc_ty = mean_ptr.dtype.element_ty
    s1 = _sum_partials(part_ptr, 0, P, C, cols, cmask, acc_ty, BLOCK_P, BLOCK_C)
    s2 = _sum_partials(part_ptr, P, P, C, cols, cmask, acc_ty, BLOCK_P, BLOCK_C)
    shift = tl.load(part_ptr + 2 * P * C + cols, mask=cmask, other=0.0, cache_modifier=".cg")
    n = tl.zeros((), acc_ty) + M
    mean = shift + s1 / n
    m2 = tl.maximum(s2 - s1 * (s1 / n), 0.0)  # sum of squared deviations from the mean
    tl.store(mean_ptr + cols, mean, mask=cmask)
    tl.store(rstd_ptr + cols, _inv_sqrt(m2 / n + eps), mask=cmask)
    if UPDATE:
        # as torch: running = (1 - momentum) * running + momentum * batch, unbiased var
        rm = tl.load(rmean_ptr + cols, mask=cmask, other=0.0).to(acc_ty)
        rv = tl.load(rvar_ptr + cols, mask=cmask, other=0.0).to(acc_ty)
        rm = (1.0 - momentum) * rm + momentum * mean
        rv = (1.0 - momentum) * rv + momentum * (m2 / (n - 1.0))
        tl.store(rmean_ptr + cols, rm.to(rmean_ptr.dtype.element_ty), mask=cmask)
        tl.store(rvar_ptr + cols, rv.to(rvar_ptr.dtype.element_ty), mask=cmask)
