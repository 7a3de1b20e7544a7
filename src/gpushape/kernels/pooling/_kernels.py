"""Triton kernels of max_pool2d: the forward (maxima and their int8 taps) and the gather
backward. Launchers live in `_launch.py`, the op in `max_pool.py`.

Both kernels work on a 2-D tile of (pixels, channels), laid out by the constexpr CHANNELS_LAST:
  channels_last: pixels p in [0, N*PH*PW), channels c in [0, C); tile (BLOCK_P, BLOCK_C),
                 channels fastest (contiguous in memory: 16-byte loads)
  NCHW:          pixels p in [0, PH*PW) of one plane, "channels" c in [0, N*C) the planes;
                 tile (BLOCK_C, BLOCK_P), pixels fastest
where PH x PW is the grid the kernel walks: the output for the forward, the input for the
backward. WIDE (more than 2^31 elements) takes the tile's indices, and every offset built from
them, in int64.

Ties and NaN, as PyTorch (CPU, and CUDA's NCHW and channels_last kernels): a tap replaces the
running maximum when it is strictly greater or NaN, in row-major window order, so the first
maximum wins a tie and the last NaN wins a window holding NaN. Padding taps read -inf and are
never taken; the index starts at the first in-bounds tap, so a window of -inf keeps that tap.
(PyTorch's CUDA channels_last forward starts its index at 0 instead, input pixel (0, 0), which
differs only for a window whose every value is -inf.)
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(
    n_pix,
    n_ch,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
    WIDE: tl.constexpr,
):
    """This program's pixel and channel indices, broadcast to the tile, and the in-bounds mask.
    Neighbouring programs cover neighbouring memory: channel blocks of one pixel block
    (channels_last), pixel blocks of one block of planes (NCHW)."""
    pid = tl.program_id(0)
    if CHANNELS_LAST:
        n_cb = tl.cdiv(n_ch, BLOCK_C)
        pid_p, pid_c = pid // n_cb, pid % n_cb
    else:
        n_pb = tl.cdiv(n_pix, BLOCK_P)
        pid_p, pid_c = pid % n_pb, pid // n_pb
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    if WIDE:
        p, c = p.to(tl.int64), c.to(tl.int64)
    if CHANNELS_LAST:
        p, c = p[:, None], c[None, :]
    else:
        p, c = p[None, :], c[:, None]
    return p, c, (p < n_pix) & (c < n_ch)


@triton.jit
def _max_pool_fwd_kernel(
    x_ptr,  # (N, C, H, W) input, dense NCHW or channels_last
    y_ptr,  # (N, C, OH, OW) out: the window maxima, in x's layout
    idx_ptr,  # (N, C, OH, OW) int8 out: each maximum's tap kh * KW + kw, in x's layout
    C,
    H,
    W,
    OH,
    OW,
    n_pix,  # N*OH*OW (channels_last) or OH*OW (NCHW)
    n_ch,  # C (channels_last) or N*C (NCHW)
    KH: tl.constexpr,
    KW: tl.constexpr,
    SH: tl.constexpr,
    SW: tl.constexpr,
    PH: tl.constexpr,
    PW: tl.constexpr,
    WRITE_INDEX: tl.constexpr,  # False: inference, no taps written
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
    WIDE: tl.constexpr,
):
    # read x (each element from DRAM once, its KH*KW/(SH*SW) reuses from cache); write y, idx
    p, c, mask = _tile(n_pix, n_ch, BLOCK_P, BLOCK_C, CHANNELS_LAST, WIDE)
    if CHANNELS_LAST:
        n = p // (OH * OW)
        r = p - n * (OH * OW)
        x_base = n * H * W * C + c  # (n, c, 0, 0)
        x_sh = W * C
        x_sw = C
        out = p * C + c
    else:
        r = p
        x_base = c * H * W
        x_sh = W
        x_sw = 1
        out = c * (OH * OW) + p
    oh = r // OW
    ow = r - oh * OW
    h0 = oh * SH - PH  # the window's top-left input pixel (negative: padding)
    w0 = ow * SW - PW
    # compared in float32 (float64 for float64): exact, and the interpreter's bfloat16
    # comparisons are not
    best = tl.where(mask, float("-inf"), float("-inf"))
    if x_ptr.dtype.element_ty == tl.float64:
        best = best.to(tl.float64)
    first = tl.maximum(-h0, 0) * KW + tl.maximum(-w0, 0)  # the first in-bounds tap
    best_idx = tl.where(mask, first, first)
    for kh in tl.static_range(KH):
        ih = h0 + kh
        row_ok = mask & (ih >= 0) & (ih < H)
        for kw in tl.static_range(KW):
            iw = w0 + kw
            ok = row_ok & (iw >= 0) & (iw < W)
            v = tl.load(x_ptr + x_base + ih * x_sh + iw * x_sw, mask=ok, other=float("-inf"))
            v = v.to(best.dtype)
            take = (v > best) | (v != v)  # strictly greater, or NaN (see the docstring)
            best = tl.where(take, v, best)
            best_idx = tl.where(take, kh * KW + kw, best_idx)
    tl.store(y_ptr + out, best.to(y_ptr.dtype.element_ty), mask=mask)
    if WRITE_INDEX:
        tl.store(idx_ptr + out, best_idx.to(tl.int8), mask=mask)


@triton.jit
def _max_pool_bwd_kernel(
    dy_ptr,  # (N, C, OH, OW) gradient of y, dense in x's layout
    idx_ptr,  # (N, C, OH, OW) int8 taps from the forward, in x's layout
    dx_ptr,  # (N, C, H, W) out: gradient of x, in x's layout and dtype
    C,
    H,
    W,
    OH,
    OW,
    n_pix,  # N*H*W (channels_last) or H*W (NCHW): the tile walks the input
    n_ch,  # C (channels_last) or N*C (NCHW)
    KH: tl.constexpr,
    KW: tl.constexpr,
    SH: tl.constexpr,
    SW: tl.constexpr,
    PH: tl.constexpr,
    PW: tl.constexpr,
    ACC_FP64: tl.constexpr,  # float64 sums for float64 gradients, else float32
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
    WIDE: tl.constexpr,
):
    # read idx, dy (each once from DRAM; the neighbouring input pixels that share a window read
    # it again from cache); write dx. No atomics: each program owns its input pixels, and the
    # at most ceil(KH/SH) x ceil(KW/SW) windows covering a pixel are summed in ascending order.
    p, c, mask = _tile(n_pix, n_ch, BLOCK_P, BLOCK_C, CHANNELS_LAST, WIDE)
    if CHANNELS_LAST:
        n = p // (H * W)
        r = p - n * (H * W)
        o_base = n * OH * OW * C + c
        o_sh = OW * C
        o_sw = C
        out = p * C + c
    else:
        r = p
        o_base = c * OH * OW
        o_sh = OW
        o_sw = 1
        out = c * (H * W) + p
    ih = r // W
    iw = r - ih * W
    oh_last = (ih + PH) // SH  # the last window row covering ih (ih + PH >= 0)
    kh_last = ih + PH - oh_last * SH  # ih's tap row in that window, in [0, SH)
    ow_last = (iw + PW) // SW
    kw_last = iw + PW - ow_last * SW
    acc = tl.where(mask, 0.0, 0.0)
    if ACC_FP64:
        acc = acc.to(tl.float64)
    # ceil(KH / SH) x ceil(KW / SW) candidate windows, counted back from the last: oh ascends
    for jh in tl.static_range((KH + SH - 1) // SH):
        back_h = (KH + SH - 1) // SH - 1 - jh
        oh = oh_last - back_h
        kh = kh_last + back_h * SH
        row_ok = mask & (oh >= 0) & (oh < OH) & (kh < KH)
        for jw in tl.static_range((KW + SW - 1) // SW):
            back_w = (KW + SW - 1) // SW - 1 - jw
            ow = ow_last - back_w
            kw = kw_last + back_w * SW
            ok = row_ok & (ow >= 0) & (ow < OW) & (kw < KW)
            o = o_base + oh * o_sh + ow * o_sw
            tap = tl.load(idx_ptr + o, mask=ok, other=-1)
            # dy under the window mask (not the tap match): a whole-vector load
            g = tl.load(dy_ptr + o, mask=ok, other=0.0)
            hit = tap.to(tl.int32) == kh * KW + kw
            acc += tl.where(hit, g.to(acc.dtype), 0.0)
    tl.store(dx_ptr + out, acc.to(dx_ptr.dtype.element_ty), mask=mask)
