"""Triton kernels of group normalization with an optional activation, forward and backward.
Launchers live in `_launch.py`, the op in `group_norm.py`.

Every kernel sees the input as (N, P, C): N samples, P pixels (the product of the dims after
the channels), C channels in G groups of CPG = C / G consecutive channels, with element strides
(sn, sp, sc), so one kernel serves both layouts: NCHW-contiguous (pixels fastest, sp = 1) and
channels_last (channels fastest, sc = 1). Triton specialises a stride of 1, so the loads are
coalesced along whichever axis is contiguous. WIDE (2^31 elements or more) takes every offset
in int64.

Three kernels a direction, as the GRN kernels (kernels/grn) are built:
  _gn_sums_kernel   per (sample, channel), partial sums over a slice of the pixels, one program
                    per (sample, channel block, pixel slice), each writing its own partial: no
                    atomics, the same sums in the same order every run. Forward: the slice's
                    mean and M2 (the sum of squared deviations) per channel, by Welford's
                    update in each lane and Chan's formula across lanes, as PyTorch's kernels
                    keep their statistics (no E[x^2] - E[x]^2 cancellation); backward: sum dz
                    and sum dz * (x - mean), dz the gradient reaching the norm's output
                    through the activation (recomputed from x).
  _gn_group_kernel  one program per (sample, group): the partials combined into the group's
                    mean and 1/std (per channel first, then Chan's formula across the channels),
                    and the per-(sample, channel) coefficients the elementwise pass needs.
  _gn_apply_kernel  the elementwise pass: y = act((x - mean) * scale + bias) (forward) or
                    dx = dz * scale + x * coef + const (backward).
The backward's weight and bias gradients add the samples' terms in a fixed order with the GRN's
`_grn_param_grads_kernel`. Sums and the per-group arithmetic run in float32 (float64 for
float64 input).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..batch_norm._act_math import _act_fwd, _act_grad

RELU = tl.constexpr(5)  # ReLU's activation code (the others: ACT_CODES)
# where the partial sums start in the workspace, in (N, C) tables: after scale, bias and mean
# (forward), after those, coef, const and the two parameter-gradient terms (backward)
FORWARD_WS = tl.constexpr(3)
BACKWARD_WS = tl.constexpr(7)


@triton.jit
def _activate(z, ACT: tl.constexpr):
    if ACT == RELU:
        return tl.where(z < 0.0, 0.0, z)  # NaN stays NaN, as torch.relu
    else:
        return _act_fwd(z, ACT)


@triton.jit
def _act_backward(dy, z, ACT: tl.constexpr):
    """The gradient reaching z = (x - mean) * scale + bias from dy at act(z)."""
    if ACT == RELU:
        return tl.where(z <= 0.0, 0.0, dy)  # torch's threshold_backward: NaN passes dy on
    elif ACT == 0:
        return dy
    else:
        return dy * _act_grad(z, ACT)


@triton.jit
def _channel_coefs(n, c, c_ok, G, CPG, mean_ptr, rstd_ptr, w_ptr, b_ptr, acc_ty: tl.constexpr):
    """(scale, bias, mean) of channels c of sample n: the forward's (x - mean) * scale + bias
    (x - mean first: x * scale + (bias - mean * scale) cancels where the mean is large)."""
    grp = n * G + c // CPG
    mean = tl.load(mean_ptr + grp, mask=c_ok, other=0.0)
    rstd = tl.load(rstd_ptr + grp, mask=c_ok, other=0.0)
    w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(acc_ty)
    b = tl.load(b_ptr + c, mask=c_ok, other=0.0).to(acc_ty)
    return rstd * w, b, mean


@triton.jit
def _gn_sums_kernel(
    x_ptr,  # (N, P, C) input, strides (sn, sp, sc)
    dy_ptr,  # backward: the output's gradient, x's strides; forward: unused (x stands in)
    stats_ptr,  # backward: (2, N, G) the forward's group means and 1/std; forward: unused
    w_ptr,  # backward: (C,) weight; forward: unused
    b_ptr,  # backward: (C,) bias; forward: unused
    work_ptr,  # the call's float32 workspace (`_launch.py`): out, the partials at WS_OFFSET
    N,
    P,
    C,
    G,
    CPG,
    sn,
    sp,
    sc,
    p_per_split,  # the pixels one program sums: a multiple of BLOCK_P
    SPLITS,
    BACKWARD: tl.constexpr,
    ACT: tl.constexpr,
    ACC_FP64: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ALIGN: tl.constexpr,  # the largest power of two (to 16) dividing sn and sc
    WIDE: tl.constexpr,
):
    ws_ptr = work_ptr + (BACKWARD_WS if BACKWARD else FORWARD_WS) * N * C
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
    acc1 = tl.zeros([BLOCK_P, BLOCK_C], dtype=acc_ty)  # backward: sum dz; forward: the mean
    acc2 = tl.zeros([BLOCK_P, BLOCK_C], dtype=acc_ty)  # backward: sum dz (x - mean); fwd: M2
    count = tl.zeros([BLOCK_P], dtype=acc_ty)  # forward: the pixels each lane has taken
    base = n * sn + c * sc
    if ALIGN > 1:  # every row starts at a multiple of ALIGN elements: vector loads
        base = tl.multiple_of(base, ALIGN)
    base = base[None, :]
    if BACKWARD:
        scale, shift, mean = _channel_coefs(
            n, c, c_ok, G, CPG, stats_ptr, stats_ptr + N * G, w_ptr, b_ptr, acc_ty
        )
        scale, shift, mean = scale[None, :], shift[None, :], mean[None, :]
    for step in range(0, p_per_split, BLOCK_P):
        p = p_start + step + offs_p
        p_ok = p < P
        ok = p_ok[:, None] & c_ok[None, :]
        off = base + p[:, None] * sp
        x = tl.load(x_ptr + off, mask=ok, other=0.0).to(acc_ty)
        if BACKWARD:
            dy = tl.load(dy_ptr + off, mask=ok, other=0.0).to(acc_ty)
            dz = _act_backward(dy, (x - mean) * scale + shift, ACT)
            acc1 += dz
            acc2 += tl.where(ok, dz * (x - mean), 0.0)
        else:
            # Welford's update in every lane (a lane is one pixel offset of the tile)
            count += p_ok.to(acc_ty)
            inv = 1.0 / tl.maximum(count, 1.0)
            delta = tl.where(ok, x - acc1, 0.0)
            acc1 += delta * inv[:, None]
            acc2 += tl.where(ok, delta * (x - acc1), 0.0)
    out = (split * N + n) * C + c
    if BACKWARD:
        tl.store(ws_ptr + out, tl.sum(acc1, axis=0), mask=c_ok)
        tl.store(ws_ptr + SPLITS * N * C + out, tl.sum(acc2, axis=0), mask=c_ok)
    else:  # the lanes combined by Chan's formula: the slice's mean and M2 per channel
        total = tl.maximum(tl.sum(count, axis=0), 1.0)
        mean_c = tl.sum(acc1 * count[:, None], axis=0) / total
        d = acc1 - mean_c[None, :]
        m2_c = tl.sum(acc2 + d * d * count[:, None], axis=0)
        tl.store(ws_ptr + out, mean_c, mask=c_ok)
        tl.store(ws_ptr + SPLITS * N * C + out, m2_c, mask=c_ok)


@triton.jit
def _split_sum(ws_ptr, n, c, c_ok, N, C, SPLITS, acc_ty: tl.constexpr):
    """The partial sums of (sample n, channels c) over the pixel slices, added in slice order."""
    total = tl.zeros(c.shape, dtype=acc_ty)
    for s in range(0, SPLITS):
        total += tl.load(ws_ptr + (s * N + n) * C + c, mask=c_ok, other=0.0)
    return total


@triton.jit
def _channel_stats(ws_ptr, n, c, c_ok, N, C, P, SPLITS, p_per_split, acc_ty: tl.constexpr):
    """(mean, M2) of channels c of sample n over all its pixels, from the slices' (mean, M2)
    (Chan's formula, slices in order: slice s holds min(p_per_split, P - s p_per_split))."""
    mean = tl.zeros(c.shape, dtype=acc_ty)
    for s in range(0, SPLITS):
        cnt = tl.minimum(p_per_split, P - s * p_per_split)
        mean += cnt * tl.load(ws_ptr + (s * N + n) * C + c, mask=c_ok, other=0.0)
    mean = mean / P
    m2 = tl.zeros(c.shape, dtype=acc_ty)
    for s in range(0, SPLITS):
        cnt = tl.minimum(p_per_split, P - s * p_per_split)
        d = tl.load(ws_ptr + (s * N + n) * C + c, mask=c_ok, other=0.0) - mean
        m2 += tl.load(ws_ptr + ((SPLITS + s) * N + n) * C + c, mask=c_ok, other=0.0)
        m2 += cnt * d * d
    return mean, m2


@triton.jit
def _gn_group_kernel(
    work_ptr,  # the workspace: in, the partials from _gn_sums_kernel; out, the tables
    stats_ptr,  # (2, N, G) the group means and 1/std: forward out, backward in
    w_ptr,  # (C,) weight
    b_ptr,  # (C,) bias
    N,
    P,
    C,
    G,
    CPG,
    SPLITS,
    p_per_split,
    eps,
    BACKWARD: tl.constexpr,
    ACC_FP64: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # Forward, per channel: its mean m_c and M2_c over the pixels (`_channel_stats`); the
    # group: mean = avg_c m_c, M2 = sum_c M2_c + P (m_c - mean)^2, var = M2 / (CPG P).
    # Backward, with dz the gradient at the norm's output, xhat = (x - mean) rstd,
    # A_c = sum_p dz and B_c = sum_p dz (x - mean) over the channel's pixels:
    #   dx = rstd (w dz - m1 - xhat m2),  m1 = sum_c w_c A_c / M,  m2 = rstd sum_c w_c B_c / M
    #      = (rstd w) dz + (x - mean) (-rstd^2 m2) - rstd m1,   M = CPG P
    #   dweight_c = sum_n rstd B_c,  dbias_c = sum_n A_c
    # the workspace's (N, C) tables: scale = rstd * w (what x - mean, or dz, is scaled by),
    # the bias b and the group's mean (a table: the elementwise pass reads a row, no division);
    # backward also coef (what x - mean is scaled by in dx), const (what dx adds) and the
    # samples' terms of dweight and dbias (2, N, C); then the partials
    scale_ptr, shift_ptr, mean_tab = work_ptr, work_ptr + N * C, work_ptr + 2 * N * C
    coef_ptr, const_ptr, parts_ptr = (
        work_ptr + 3 * N * C,
        work_ptr + 4 * N * C,
        work_ptr + 5 * N * C,
    )
    ws_ptr = work_ptr + (BACKWARD_WS if BACKWARD else FORWARD_WS) * N * C
    mean_ptr, rstd_ptr = stats_ptr, stats_ptr + N * G
    pid = tl.program_id(0)
    n = pid // G
    grp = pid % G
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    offs = tl.arange(0, BLOCK_C)
    c_lo = grp * CPG
    count = CPG * 1.0 * P  # float: CPG * P may pass 2^31 in one sample
    if BACKWARD:
        mean = tl.load(mean_ptr + pid)
        rstd = tl.load(rstd_ptr + pid)
        wa = tl.zeros([BLOCK_C], dtype=acc_ty)
        wb = tl.zeros([BLOCK_C], dtype=acc_ty)
        for c0 in range(0, CPG, BLOCK_C):
            c = c_lo + c0 + offs
            c_ok = c0 + offs < CPG
            w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(acc_ty)
            a = _split_sum(ws_ptr, n, c, c_ok, N, C, SPLITS, acc_ty)
            b = _split_sum(ws_ptr + SPLITS * N * C, n, c, c_ok, N, C, SPLITS, acc_ty)
            wa += w * a
            wb += w * b
            tl.store(parts_ptr + n * C + c, rstd * b, mask=c_ok)
            tl.store(parts_ptr + (N + n) * C + c, a, mask=c_ok)
        m1 = tl.sum(wa, axis=0) / count
        m2 = rstd * tl.sum(wb, axis=0) / count
        coef = -rstd * rstd * m2  # of x - mean: no cancellation where the mean is large
        const = -rstd * m1
    else:
        msum = tl.zeros([BLOCK_C], dtype=acc_ty)
        for c0 in range(0, CPG, BLOCK_C):  # pass 1: the channels' means
            c = c_lo + c0 + offs
            c_ok = c0 + offs < CPG
            mean_c, _ = _channel_stats(ws_ptr, n, c, c_ok, N, C, P, SPLITS, p_per_split, acc_ty)
            msum += tl.where(c_ok, mean_c, 0.0)
        mean = tl.sum(msum, axis=0) / CPG
        m2 = tl.zeros([BLOCK_C], dtype=acc_ty)
        for c0 in range(0, CPG, BLOCK_C):  # pass 2: the spread about the group's mean
            c = c_lo + c0 + offs
            c_ok = c0 + offs < CPG
            mean_c, m2_c = _channel_stats(ws_ptr, n, c, c_ok, N, C, P, SPLITS, p_per_split, acc_ty)
            dm = mean_c - mean
            m2 += tl.where(c_ok, m2_c + P * dm * dm, 0.0)
        var = tl.sum(m2, axis=0) / count
        rstd = 1.0 / tl.sqrt(var + eps)
        tl.store(mean_ptr + pid, mean)
        tl.store(rstd_ptr + pid, rstd)
    for c0 in range(0, CPG, BLOCK_C):  # the per-(sample, channel) coefficients
        c = c_lo + c0 + offs
        c_ok = c0 + offs < CPG
        w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(acc_ty)
        b = tl.load(b_ptr + c, mask=c_ok, other=0.0).to(acc_ty)
        scale = rstd * w
        tl.store(scale_ptr + n * C + c, scale, mask=c_ok)
        tl.store(shift_ptr + n * C + c, b, mask=c_ok)
        tl.store(mean_tab + n * C + c, tl.zeros([BLOCK_C], dtype=acc_ty) + mean, mask=c_ok)
        if BACKWARD:
            tl.store(coef_ptr + n * C + c, tl.zeros([BLOCK_C], dtype=acc_ty) + coef, mask=c_ok)
            tl.store(const_ptr + n * C + c, tl.zeros([BLOCK_C], dtype=acc_ty) + const, mask=c_ok)


@triton.jit
def _gn_apply_kernel(
    x_ptr,  # (N, P, C) input, strides (sn, sp, sc)
    dy_ptr,  # backward: the output's gradient, x's strides; forward: unused (x stands in)
    out_ptr,  # out: y (forward) or dx (backward), x's strides
    work_ptr,  # the workspace's (N, C) tables: scale, bias, mean, and backward coef and const
    N,
    P,
    C,
    numel,  # N * C * P
    sn,
    sp,
    sc,
    BACKWARD: tl.constexpr,
    ACT: tl.constexpr,
    ACC_FP64: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    LAYOUT: tl.constexpr,  # 0: channels fastest; 1: pixels fastest, tiles; 2: NCHW, flat
    WIDE: tl.constexpr,
):
    pid = tl.program_id(0)
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    if LAYOUT == 2:
        # NCHW contiguous: the tensor flat, BLOCK_P * BLOCK_C elements a program, each
        # element's (sample, channel) row of the tables its index // P. Aligned, whatever P is
        # (a 14x14 map's rows start at odd bytes: 2-D tiles over them load an element a time)
        start = pid
        if WIDE:  # before the product: pid * BLOCK passes 2^31 there
            start = start.to(tl.int64)
        start = start * (BLOCK_P * BLOCK_C)
        off = start + tl.arange(0, BLOCK_P * BLOCK_C)
        ok = off < numel
        row = off // P
        t_ok = ok
    else:
        n_pb = tl.cdiv(P, BLOCK_P)
        n_cb = tl.cdiv(C, BLOCK_C)
        per_sample = n_pb * n_cb
        n = pid // per_sample
        r = pid % per_sample
        if LAYOUT == 0:  # neighbouring programs: channel blocks of one pixel block
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
        row = (n * C + c)[None, :]
        t_ok = c_ok[None, :]
    scale = tl.load(work_ptr + row, mask=t_ok, other=0.0)
    shift = tl.load(work_ptr + N * C + row, mask=t_ok, other=0.0)
    mean = tl.load(work_ptr + 2 * N * C + row, mask=t_ok, other=0.0)
    x = tl.load(x_ptr + off, mask=ok, other=0.0).to(acc_ty)
    z = (x - mean) * scale + shift
    if BACKWARD:
        coef = tl.load(work_ptr + 3 * N * C + row, mask=t_ok, other=0.0)
        const = tl.load(work_ptr + 4 * N * C + row, mask=t_ok, other=0.0)
        dy = tl.load(dy_ptr + off, mask=ok, other=0.0).to(acc_ty)
        out = _act_backward(dy, z, ACT) * scale + (x - mean) * coef + const
    else:
        out = _activate(z, ACT)
    tl.store(out_ptr + off, out.to(out_ptr.dtype.element_ty), mask=ok)
