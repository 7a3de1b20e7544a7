"""Triton kernels of global response normalization (GRN), forward and backward. Launchers live
in `_launch.py`, the op in `grn.py`.

Every kernel sees the input as (N, P, C): N samples, P = H*W pixels, C channels, with element
strides (sn, sp, sc) over them, so one kernel serves both layouts: channels fastest (timm's
`channels_last=True`, an (N, H, W, C) tensor, or an NCHW tensor in channels_last memory: sc = 1)
and pixels fastest (an NCHW-contiguous tensor: sp = 1). Triton specialises a stride of 1, so
the loads are coalesced along whichever axis is contiguous; CHANNELS_FASTEST only orders the
programs so that neighbours touch neighbouring memory. WIDE (more than 2^31 elements) takes
every offset in int64.

Three kernels a direction:
  _grn_sums_kernel    per (sample, channel), partial sums over a slice of the pixels
                      (forward: sum x^2; backward: sum dy*x and sum dy), one program per
                      (sample, channel block, pixel slice), each writing its own partial: no
                      atomics, the same sums in the same order every run.
  _grn_sample_kernel  one program per sample, over its C channels (a few KB): the partials
                      summed, g = sqrt(sum x^2), the mean m of g over the channels, and what
                      the elementwise pass needs per (sample, channel).
  _grn_apply_kernel   the elementwise pass: y = x * scale + bias (forward) or
                      dx = dy * scale + x * coef (backward), scale and coef per (n, c).
and in the backward a fourth, _grn_param_grads_kernel, which adds the samples' terms of the
weight's and bias's gradients (in a fixed order: deterministic, no atomics).
Sums and the per-sample arithmetic run in float32 (float64 for float64 input).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _grn_sums_kernel(
    x_ptr,  # (N, P, C) input, strides (sn, sp, sc)
    dy_ptr,  # backward: the output's gradient, x's strides; forward: unused (x stands in)
    ws_ptr,  # out: (K, SPLITS, N, C) partial sums; K = 1 (sum x^2) or 2 (sum dy*x, sum dy)
    N,
    P,
    C,
    sn,
    sp,
    sc,
    p_per_split,  # the pixels one program sums: a multiple of BLOCK_P
    SPLITS,
    BACKWARD: tl.constexpr,
    ACC_FP64: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    WIDE: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    n_cb = tl.cdiv(C, BLOCK_C)
    n = pid // n_cb
    c = (pid % n_cb) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    p_start = split * p_per_split
    offs_p = tl.arange(0, BLOCK_P)
    if WIDE:
        n, c, p_start = n.to(tl.int64), c.to(tl.int64), p_start.to(tl.int64)
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=acc_ty)
    acc_dy = tl.zeros([BLOCK_P, BLOCK_C], dtype=acc_ty)
    base = n * sn + c[None, :] * sc
    for step in range(0, p_per_split, BLOCK_P):
        p = p_start + step + offs_p
        ok = (p < P)[:, None] & c_ok[None, :]
        off = base + p[:, None] * sp
        x = tl.load(x_ptr + off, mask=ok, other=0.0).to(acc_ty)
        if BACKWARD:
            dy = tl.load(dy_ptr + off, mask=ok, other=0.0).to(acc_ty)
            acc += dy * x
            acc_dy += dy
        else:
            acc += x * x
    out = (split * N + n) * C + c
    tl.store(ws_ptr + out, tl.sum(acc, axis=0), mask=c_ok)
    if BACKWARD:
        tl.store(ws_ptr + SPLITS * N * C + out, tl.sum(acc_dy, axis=0), mask=c_ok)


@triton.jit
def _split_sum(ws_ptr, n, c, c_ok, N, C, SPLITS, acc_ty: tl.constexpr):
    """The partial sums of (sample n, channels c) over the pixel slices, added in slice order."""
    total = tl.zeros(c.shape, dtype=acc_ty)
    for s in range(0, SPLITS):
        total += tl.load(ws_ptr + (s * N + n) * C + c, mask=c_ok, other=0.0)
    return total


@triton.jit
def _grn_sample_kernel(
    ws_ptr,  # (K, SPLITS, N, C) partial sums from _grn_sums_kernel
    g_ptr,  # (N, C): forward: out, the L2 norm over the pixels; backward: in, the forward's
    w_ptr,  # (C,) the GRN weight (gamma)
    scale_ptr,  # out (N, C): 1 + w * g / (m + eps), what x (forward) or dy (backward) is scaled by
    coef_ptr,  # backward out (N, C): what x is scaled by in dx
    parts_ptr,  # backward out (2, N, C): this sample's terms of dw (sum dy*x * g/(m+eps)) and db
    N,
    C,
    SPLITS,
    eps,
    BACKWARD: tl.constexpr,
    ACC_FP64: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # For one sample, with d = m + eps and a_c = w_c * sum_p dy*x:
    #   y  = x + bias + w * x * g / d
    #   dg_c = a_c / d - sum_c' a_c' g_c' / (C d^2)      (d depends on every g through m)
    #   dx = dy * (1 + w g / d) + x * dg / g             (dg / g taken as 0 where g = 0, as
    #                                                    PyTorch's norm backward does)
    n = tl.program_id(0)
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    offs = tl.arange(0, BLOCK_C)
    g_total = tl.zeros([BLOCK_C], dtype=acc_ty)
    ag_total = tl.zeros([BLOCK_C], dtype=acc_ty)
    for c0 in range(0, C, BLOCK_C):  # pass 1: the sums over channels
        c = c0 + offs
        c_ok = c < C
        if BACKWARD:
            g = tl.load(g_ptr + n * C + c, mask=c_ok, other=0.0).to(acc_ty)
            w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(acc_ty)
            s_dyx = _split_sum(ws_ptr, n, c, c_ok, N, C, SPLITS, acc_ty)
            ag_total += w * s_dyx * g
        else:
            g = tl.sqrt(_split_sum(ws_ptr, n, c, c_ok, N, C, SPLITS, acc_ty))
        g_total += g
    d = tl.sum(g_total, axis=0) / C + eps
    ag = tl.sum(ag_total, axis=0)
    for c0 in range(0, C, BLOCK_C):  # pass 2: per channel
        c = c0 + offs
        c_ok = c < C
        w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(acc_ty)
        if BACKWARD:
            g = tl.load(g_ptr + n * C + c, mask=c_ok, other=0.0).to(acc_ty)
        else:
            g = tl.sqrt(_split_sum(ws_ptr, n, c, c_ok, N, C, SPLITS, acc_ty))
            tl.store(g_ptr + n * C + c, g, mask=c_ok)
        ratio = g / d
        tl.store(scale_ptr + n * C + c, 1.0 + w * ratio, mask=c_ok)
        if BACKWARD:
            s_dyx = _split_sum(ws_ptr, n, c, c_ok, N, C, SPLITS, acc_ty)
            s_dy = _split_sum(ws_ptr + SPLITS * N * C, n, c, c_ok, N, C, SPLITS, acc_ty)
            dg = w * s_dyx / d - ag / (C * d * d)
            coef = tl.where(g > 0, dg / tl.where(g > 0, g, 1.0), 0.0)
            tl.store(coef_ptr + n * C + c, coef, mask=c_ok)
            tl.store(parts_ptr + n * C + c, s_dyx * ratio, mask=c_ok)
            tl.store(parts_ptr + (N + n) * C + c, s_dy, mask=c_ok)


@triton.jit
def _grn_apply_kernel(
    u_ptr,  # forward: x; backward: dy (x's strides)
    v_ptr,  # backward: x; forward: unused (u stands in)
    out_ptr,  # out: y (forward) or dx (backward), x's strides and dtype
    scale_ptr,  # (N, C) float32 (float64): what u is scaled by
    coef_ptr,  # backward: (N, C), what v is scaled by; forward: unused
    bias_ptr,  # forward: (C,) the GRN bias (beta); backward: unused
    P,
    C,
    sn,
    sp,
    sc,
    BACKWARD: tl.constexpr,
    ACC_FP64: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNELS_FASTEST: tl.constexpr,
    WIDE: tl.constexpr,
):
    pid = tl.program_id(0)
    n_pb = tl.cdiv(P, BLOCK_P)
    n_cb = tl.cdiv(C, BLOCK_C)
    per_sample = n_pb * n_cb
    n = pid // per_sample
    r = pid % per_sample
    if CHANNELS_FASTEST:  # neighbouring programs: channel blocks of one pixel block
        pb, cb = r // n_cb, r % n_cb
    else:
        pb, cb = r % n_pb, r // n_pb
    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    if WIDE:
        n, p, c = n.to(tl.int64), p.to(tl.int64), c.to(tl.int64)
    c_ok = c < C
    ok = (p < P)[:, None] & c_ok[None, :]
    off = n * sn + p[:, None] * sp + c[None, :] * sc
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    scale = tl.load(scale_ptr + n * C + c, mask=c_ok, other=0.0)[None, :]
    u = tl.load(u_ptr + off, mask=ok, other=0.0).to(acc_ty)
    if BACKWARD:
        coef = tl.load(coef_ptr + n * C + c, mask=c_ok, other=0.0)[None, :]
        v = tl.load(v_ptr + off, mask=ok, other=0.0).to(acc_ty)
        out = u * scale + v * coef
    else:
        bias = tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(acc_ty)[None, :]
        out = u * scale + bias
    tl.store(out_ptr + off, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _grn_param_grads_kernel(
    parts_ptr,  # (2, N, C) float32 (float64): each sample's terms of dw and db
    dw_ptr,  # out (C,), the weight's dtype
    db_ptr,  # out (C,), the bias's dtype
    N,
    C,
    ACC_FP64: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # BLOCK_N samples' terms a step (all of a batch of up to BLOCK_N in one: no chain of
    # dependent loads), summed down the tile: the same order, the same gradients every run
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    offs_n = tl.arange(0, BLOCK_N)
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    dw = tl.zeros([BLOCK_N, BLOCK_C], dtype=acc_ty)
    db = tl.zeros([BLOCK_N, BLOCK_C], dtype=acc_ty)
    for n0 in range(0, N, BLOCK_N):
        n = n0 + offs_n
        ok = (n < N)[:, None] & c_ok[None, :]
        off = n[:, None] * C + c[None, :]
        dw += tl.load(parts_ptr + off, mask=ok, other=0.0)
        db += tl.load(parts_ptr + N * C + off, mask=ok, other=0.0)
    tl.store(dw_ptr + c, tl.sum(dw, axis=0).to(dw_ptr.dtype.element_ty), mask=c_ok)
    tl.store(db_ptr + c, tl.sum(db, axis=0).to(db_ptr.dtype.element_ty), mask=c_ok)
