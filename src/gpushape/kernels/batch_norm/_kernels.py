"""Triton kernels of batch_norm_act: per-channel statistics, the fused normalise+residual+activation
pass, and its backward. Launchers live in `_launch.py`, the op in `batch_norm_act.py`.

Every kernel reads a 4-D tensor through one (O, L, C) view, chosen by the constexpr CHANNELS_LAST:
  channels_last (NHWC): O = 1, L = N*H*W, element (l, c) at l*C + c      (C contiguous: fast path)
  NCHW:                 O = N, L = H*W,   element (o, l, c) at o*C*L + c*L + l   (L contiguous)
A "row block" is BLOCK_L consecutive l of one o; the flat row index o*L + l is the same N*H*W
order in both layouts, which is how the ReLU mask (one bit per element, 8 channels a byte:
shape (N*H*W, ceil(C/8)), uint8) is laid out. The smooth activations (SiLU, GELU, Hardswish:
`_act_math.py`, constexpr ACT) write no mask: their backward recomputes the pre-activation
(`_act_bwd_kernels.py`).

Mask bytes: with 2-byte data each thread holds 8 consecutive channels (one 16-byte load), which
is exactly one mask byte, so packing and unpacking stay inside a thread. The kernels that touch
the mask do not specialise on NB (bytes a mask row): were NB known to be a multiple of 16,
Triton would vectorise the byte accesses into a layout of its own and shuffle through shared
memory on every tile.

Reductions are deterministic two-stage sums: (j, channel block) programs, program j summing row
blocks j, j + P, j + 2P, ... (so the P programs of a channel block sweep the tensor front to
back together), write partial sums; the partials are then added in a fixed order, either by the
last program of each channel block to finish (FUSED: it learns that it is last from an atomic
count per channel block, which it resets to zero for the next launch) or by a small finalize
kernel (when P * BLOCK_C partials are too many for one program to add quickly). The forward sums
(x - K) and (x - K)^2 with K = the mean of x's first row block per channel, so a mean far from
zero costs no precision. Elementwise passes visit row blocks in reverse: the reduction before
them read the tail of the tensor last, so their first reads still hit L2.

FUSED ordering (as CUTLASS's semaphores): every thread stores its partials, a CTA barrier, then
one thread's acq_rel atomic at GPU scope publishes them; the last program's own atomic acquires
them, and it reads them with .cg loads (L2, never a stale L1 line).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._act_math import _act_fwd
from ._tile_math import (
    _bits_offsets,
    _block_at,
    _channel_params,
    _finish_stats,
    _last_of_block,
    _pack_bits,
    _shifted_tile,
    _tile_offsets,
)


@triton.jit(do_not_specialize=["n_rb", "P", "M"])  # one compiled kernel for every grid size
def _stats_kernel(
    x_ptr,  # input, read through the (O, L, C) view
    part_ptr,  # (2P + 1, C) fp32/fp64: per-program sum(x - K), sum((x - K)^2); K
    count_ptr,  # (n_cb,) int32, zero between launches (FUSED)
    mean_ptr,
    rstd_ptr,  # (C,) out (FUSED): batch mean and 1/sqrt(biased var + eps)
    rmean_ptr,
    rvar_ptr,  # (C,) running stats, blended in place (FUSED and UPDATE)
    C,
    L,
    n_rb,
    P,
    M,
    eps,
    momentum,
    FUSED: tl.constexpr,
    UPDATE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    # read: x once. Program (j, channel block cb) sums row blocks j, j + P, j + 2P, ...
    pid = tl.program_id(0)
    n_cb = tl.cdiv(C, BLOCK_C)
    cb = pid % n_cb
    j = pid // n_cb
    acc_ty = part_ptr.dtype.element_ty
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    offs, s_c = _tile_offsets(C, L, BLOCK_L, BLOCK_C, CHANNELS_LAST)
    c_off = (cb * BLOCK_C).to(tl.int64) * s_c
    # K = mean of row block 0, rounded to x's dtype (so masked lanes can load K itself):
    # |K - mean| is a fraction of the spread, and so is every (x - K)
    _, _, rmask0 = _block_at(0, True, C, L, BLOCK_L, CHANNELS_LAST)
    first = tl.load(x_ptr + c_off + offs, mask=rmask0[:, None] & cmask[None, :], other=0.0)
    shift_x = (tl.sum(first.to(acc_ty), axis=0) / tl.minimum(L, BLOCK_L)).to(x_ptr.dtype.element_ty)
    shift = shift_x.to(acc_ty)
    acc1 = tl.zeros((BLOCK_L, BLOCK_C), acc_ty)
    acc2 = tl.zeros((BLOCK_L, BLOCK_C), acc_ty)
    for rb in range(j, n_rb, 2 * P):
        # two blocks per trip: both loads are in flight before either is summed
        d0 = _shifted_tile(
            x_ptr, rb, n_rb, c_off, offs, cmask, shift_x, shift, C, L, BLOCK_L, CHANNELS_LAST
        )
        d1 = _shifted_tile(
            x_ptr, rb + P, n_rb, c_off, offs, cmask, shift_x, shift, C, L, BLOCK_L, CHANNELS_LAST
        )
        acc1 += d0
        acc1 += d1
        acc2 += d0 * d0
        acc2 += d1 * d1
    tl.store(part_ptr + j * C + cols, tl.sum(acc1, axis=0), mask=cmask)
    tl.store(part_ptr + (P + j) * C + cols, tl.sum(acc2, axis=0), mask=cmask)
    if j == 0:  # every program computed the same K; the finalize needs it too
        tl.store(part_ptr + 2 * P * C + cols, shift, mask=cmask)
    if FUSED:  # noqa: SIM102 (a static if: the atomic must not be emitted unless FUSED)
        if _last_of_block(count_ptr, cb, P):
            _finish_stats(
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
                UPDATE,
                BLOCK_P,
                BLOCK_C,
            )


@triton.jit(do_not_specialize=["P", "M"])
def _stats_finalize_kernel(
    part_ptr,  # (2P + 1, C) partial shifted sums and the shift K, from _stats_kernel
    mean_ptr,
    rstd_ptr,  # (C,) out: batch mean and 1/sqrt(biased var + eps)
    rmean_ptr,
    rvar_ptr,  # (C,) running stats, blended in place when UPDATE
    C,
    P,
    M,
    eps,
    momentum,
    UPDATE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # when P * BLOCK_C partials are too many for the last reduction program to add alone
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    _finish_stats(
        part_ptr,
        cols,
        cols < C,
        C,
        P,
        M,
        eps,
        momentum,
        mean_ptr,
        rstd_ptr,
        rmean_ptr,
        rvar_ptr,
        UPDATE,
        BLOCK_P,
        BLOCK_C,
    )


@triton.jit
def _load_tile(
    ptr, rb, valid, c_off, offs, cmask, C, L, BLOCK_L: tl.constexpr, CHANNELS_LAST: tl.constexpr
):
    """Row block rb of one channel block (zeros where it is not `valid`); rb >= 0."""
    base, _, rmask = _block_at(rb, valid, C, L, BLOCK_L, CHANNELS_LAST)
    return tl.load(ptr + base + c_off + offs, mask=rmask[:, None] & cmask[None, :], other=0.0)


@triton.jit
def _apply_tile(
    x,
    res,
    rb,
    y_ptr,
    bits_ptr,
    mean,
    scale,
    bias,
    cb,
    c_off,
    offs,
    cmask,
    byte,
    C,
    L,
    NB,
    HAS_RES: tl.constexpr,
    RELU: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    """y and the mask bits of row block rb from its loaded x (and residual)."""
    y = (x.to(mean.dtype) - mean[None, :]) * scale[None, :] + bias[None, :]
    if HAS_RES:
        y += res.to(mean.dtype)
    if RELU:
        y = tl.where(y < 0.0, 0.0, y)  # not max(): NaN must propagate as in torch.relu
    if ACT != 0:  # the backward recomputes this y (the pre-activation) the same way
        y = _act_fwd(y, ACT)
    base, row0, rmask = _block_at(rb, True, C, L, BLOCK_L, CHANNELS_LAST)
    tl.store(
        y_ptr + base + c_off + offs,
        y.to(y_ptr.dtype.element_ty),
        mask=rmask[:, None] & cmask[None, :],
    )
    if RELU:
        packed = _pack_bits(y > 0.0, BLOCK_L, BLOCK_C)
        bm = rmask[:, None] & (byte < NB)[None, :]
        tl.store(
            bits_ptr + row0 * NB + cb * (BLOCK_C // 8) + _bits_offsets(NB, BLOCK_L, BLOCK_C),
            packed,
            mask=bm,
        )


@triton.jit(do_not_specialize=["NB", "n_rb", "G"])  # NB: see "Mask bytes" above
def _apply_kernel(
    x_ptr,
    res_ptr,
    y_ptr,  # (O, L, C) views: input, residual (HAS_RES), output
    bits_ptr,  # (N*H*W, NB) uint8 out: bit set where y > 0 (RELU)
    mean_ptr,
    stat_ptr,  # (C,) mean; rstd, or running var when STAT_IS_VAR (eval)
    w_ptr,
    b_ptr,  # (C,) affine weight and bias (HAS_W / HAS_B)
    C,
    L,
    NB,
    n_rb,
    G,
    eps,
    STAT_IS_VAR: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_RES: tl.constexpr,
    RELU: tl.constexpr,
    ACT: tl.constexpr,  # 0, or a smooth activation's code (`_act_math.ACT_CODES`)
    LOOP: tl.constexpr,
    PREFETCH: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    # read x (+ residual), write y (+ 1 bit an element): y = act((x - mean)*rstd*w + b + res).
    # Row blocks are counted from the end (reverse order: see the module docstring). LOOP: G
    # programs a channel block, program j doing row blocks j, j + G, ..., the next one's loads
    # issued before this one is computed (PREFETCH: two tiles live) or after it is stored;
    # else one row block a program (G = n_rb).
    pid = tl.program_id(0)
    n_cb = tl.cdiv(C, BLOCK_C)
    cb = pid % n_cb
    j = pid // n_cb
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    offs, s_c = _tile_offsets(C, L, BLOCK_L, BLOCK_C, CHANNELS_LAST)
    c_off = (cb * BLOCK_C).to(tl.int64) * s_c
    # the first tile's loads go first, so they are in flight while the channel vectors arrive
    x = _load_tile(x_ptr, n_rb - 1 - j, True, c_off, offs, cmask, C, L, BLOCK_L, CHANNELS_LAST)
    res = x
    if HAS_RES:
        res = _load_tile(
            res_ptr, n_rb - 1 - j, True, c_off, offs, cmask, C, L, BLOCK_L, CHANNELS_LAST
        )
    mean, rstd, w = _channel_params(mean_ptr, stat_ptr, w_ptr, cols, cmask, eps, STAT_IS_VAR, HAS_W)
    scale = rstd * w
    if HAS_B:
        bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(mean.dtype)
    else:
        bias = tl.zeros_like(mean)
    byte = cb * (BLOCK_C // 8) + tl.arange(0, BLOCK_C // 8)
    if LOOP:
        for i in range(j, n_rb, G):
            rb = n_rb - 1 - i
            nxt = tl.maximum(rb - G, 0)  # this program's next row block, when rb - G >= 0
            x_now, res_now = x, res
            if PREFETCH:
                x = _load_tile(
                    x_ptr, nxt, rb >= G, c_off, offs, cmask, C, L, BLOCK_L, CHANNELS_LAST
                )
                if HAS_RES:
                    res = _load_tile(
                        res_ptr, nxt, rb >= G, c_off, offs, cmask, C, L, BLOCK_L, CHANNELS_LAST
                    )
            _apply_tile(
                x_now,
                res_now,
                rb,
                y_ptr,
                bits_ptr,
                mean,
                scale,
                bias,
                cb,
                c_off,
                offs,
                cmask,
                byte,
                C,
                L,
                NB,
                HAS_RES,
                RELU,
                ACT,
                BLOCK_L,
                BLOCK_C,
                CHANNELS_LAST,
            )
            if not PREFETCH:
                x = _load_tile(
                    x_ptr, nxt, rb >= G, c_off, offs, cmask, C, L, BLOCK_L, CHANNELS_LAST
                )
                if HAS_RES:
                    res = _load_tile(
                        res_ptr, nxt, rb >= G, c_off, offs, cmask, C, L, BLOCK_L, CHANNELS_LAST
                    )
    else:
        _apply_tile(
            x,
            res,
            n_rb - 1 - j,
            y_ptr,
            bits_ptr,
            mean,
            scale,
            bias,
            cb,
            c_off,
            offs,
            cmask,
            byte,
            C,
            L,
            NB,
            HAS_RES,
            RELU,
            ACT,
            BLOCK_L,
            BLOCK_C,
            CHANNELS_LAST,
        )
