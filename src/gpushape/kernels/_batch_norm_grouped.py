"""batch_norm_act in training, channels_last, one kernel a direction, L2-resident channel groups.

The two-kernel path (`_batch_norm_kernels.py`) reads every tensor twice from memory in each
direction: the statistics need all N*H*W rows of a channel before any output of that channel
can be written. Here one persistent kernel walks the channels in groups of BLOCK_C; for each
group its P programs (all resident at once) first reduce their share of the rows (phase 1),
then, once the group's statistics are known, write the outputs of the same rows (phase 2),
whose second reads then hit L2: a group's rows are BLOCK_C * 2 bytes of each of N*H*W rows,
a few MB at ResNet's later stages against an L2 of 50-60 MB. Traffic from memory, in passes:
  forward:  read x, residual; write y, bits    = 3 + 1/16   (the two-kernel path: 4 + 1/16)
  backward: read dy, x, bits; write dx, dres   = 4 + 1/16   (the two-kernel path: 6 + 1/8)
The plan (`_batch_norm_grouped_plans.py`) takes this path only where LAG + 1 groups fit the
L2 share its configuration allows.

Latency: a program does only a few tiles of each group, so what costs is the chain of
dependent memory round trips at each group's boundary, not bandwidth. Hence: with LAG = k a
program reduces groups g + 1 .. g + k before it waits for group g's statistics (k + 1 groups
held in L2); phase 2's first tiles are loaded before the wait; phase 1's loads do not wait for
the shift K; and the partial sums are added in a two-level tree (teams of TEAM programs), so
that publishing a group's results takes two short steps, not one program reading P rows.

Synchronisation, per group g, through n_teams + 3 int32 counters (all zero between launches):
  team[t]    each program's acq_rel atomic after storing its partial sums; the last of team t
             adds the team's partials (fixed order) into a team row, resets team[t], then
  arrive     counts teams; the last team's program adds the team rows (fixed order: the result
             is deterministic), writes the group's results (mean and rstd, or dweight and
             dbias), resets arrive and releases ready = 1
  ready      programs spin on it (acquire) before their phase 2
  done       counts programs past their wait; the last resets ready and done
This needs the P programs resident together: P is at most what the occupancy API says fits,
and the launch is cooperative where Triton supports it. The interpreter runs programs one at a
time, so the plans launch P = 1 there (no program ever waits on another).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._batch_norm_kernels import (
    _last_of_block,
    _pack_bits,
    _stats_from_sums,
    _sum_partials,
    _unpack_bits,
)

# ---- synchronisation ----


@triton.jit
def _sync_base(sync_ptr, g, P, TEAM: tl.constexpr):
    """Group g's counters: [arrive, team[0 .. n_teams), ready, done]."""
    n_teams = tl.cdiv(P, TEAM)
    return sync_ptr + g * (n_teams + 3), n_teams


@triton.jit
def _arrive(part_ptr, team_ptr, sync_g, n_teams, j, P, C, cols, cmask, acc_ty: tl.constexpr,
            TEAM: tl.constexpr, BLOCK_C: tl.constexpr):
    """After program j stored its partial sums (rows j and P + j of part): True in the one
    program that is to finish the group (team sums in rows t and n_teams + t of team_ptr)."""
    team = j // TEAM
    size = tl.minimum(TEAM, P - team * TEAM)
    last = j < 0
    if _last_of_block(sync_g + 1, team, size):
        a = _sum_partials(part_ptr, team * TEAM, size, C, cols, cmask, acc_ty, TEAM, BLOCK_C)
        b = _sum_partials(part_ptr, P + team * TEAM, size, C, cols, cmask, acc_ty, TEAM,
                          BLOCK_C)
        tl.store(team_ptr + team * C + cols, a, mask=cmask)
        tl.store(team_ptr + (n_teams + team) * C + cols, b, mask=cmask)
        last = _last_of_block(sync_g, 0, n_teams)
    return last


@triton.jit
def _publish(sync_g, n_teams):
    """The finishing program: the group's results are stored; release them to the waiters."""
    tl.debug_barrier()
    tl.atomic_xchg(sync_g + n_teams + 1, 1, sem="release")


@triton.jit
def _wait(sync_g, n_teams, P):
    """Spin until the group's results are published; then count this program out of the wait
    (the last one out resets the flags for the next launch)."""
    while tl.atomic_cas(sync_g + n_teams + 1, 1, 1, sem="acquire") != 1:
        pass
    tl.debug_barrier()
    if tl.atomic_add(sync_g + n_teams + 2, 1, sem="acq_rel") == P - 1:
        tl.store(sync_g + n_teams + 1, 0)
        tl.store(sync_g + n_teams + 2, 0)


# ---- tiles ----

@triton.jit
def _tile(g, rb, valid, C, M, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """Element offsets and bounds of row block rb >= 0 of channel group g (rows of C
    elements); nothing in bounds unless `valid`."""
    rows = rb * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = g * BLOCK_C + tl.arange(0, BLOCK_C)
    base = tl.cast(rb, tl.int64) * BLOCK_L * C + g * BLOCK_C
    offs = base + tl.arange(0, BLOCK_L)[:, None] * C + tl.arange(0, BLOCK_C)[None, :]
    # (a where, not `& valid`: the interpreter mis-types bool & scalar bool)
    return offs, (rows < tl.where(valid, M, 0))[:, None] & (cols < C)[None, :]


@triton.jit
def _bits_tile(g, rb, valid, M, NB, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """Byte offsets and bounds of the mask bits of row block rb, group g (8 channels a byte)."""
    rows = rb * BLOCK_L + tl.arange(0, BLOCK_L)
    byte = g * (BLOCK_C // 8) + tl.arange(0, BLOCK_C // 8)
    offs = tl.cast(rb, tl.int64) * BLOCK_L * NB + g * (BLOCK_C // 8) \
        + tl.arange(0, BLOCK_L)[:, None] * NB + tl.arange(0, BLOCK_C // 8)[None, :]
    return offs, (rows < tl.where(valid, M, 0))[:, None] & (byte < NB)[None, :]


@triton.jit
def _n_blocks(j, n_rb, P):
    """How many row blocks program j owns (j, j + P, j + 2P, ... below n_rb)."""
    return tl.maximum(n_rb - j + P - 1, 0) // P


@triton.jit
def _trip(j, k, count, P):
    """Phase 2's trip at k (latest row blocks first): (row block a, its validity, row block b
    = a - P, its validity); invalid ones point at row block 0."""
    rb_a = j + (count - 1 - k) * P
    return tl.maximum(rb_a, 0), k < count, tl.maximum(rb_a - P, 0), k + 1 < count


# ---- forward ----

@triton.jit
def _fwd_sums(x_ptr, part_ptr, team_ptr, sync_ptr, mean_ptr, rstd_ptr, rmean_ptr, rvar_ptr,
              g, j, n_rb, C, M, P, eps, momentum,
              UPDATE: tl.constexpr, TEAM: tl.constexpr, BLOCK_L: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """Phase 1 of group g: sums of x - K over program j's rows; the finishing program turns
    the group's sums into mean, rstd (and running stats) and publishes them."""
    acc_ty = part_ptr.dtype.element_ty
    cols = g * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    # K = mean of the first row block, as the two-kernel path (every program finds the same);
    # the tiles' loads below do not depend on it, so they are in flight together
    offs, m = _tile(g, 0, True, C, M, BLOCK_L, BLOCK_C)
    first = tl.load(x_ptr + offs, mask=m, other=0.0)
    shift_x = (tl.sum(first.to(acc_ty), axis=0) / tl.minimum(M, BLOCK_L)).to(first.dtype)
    shift = shift_x.to(acc_ty)
    acc1 = tl.zeros((BLOCK_L, BLOCK_C), acc_ty)
    acc2 = tl.zeros((BLOCK_L, BLOCK_C), acc_ty)
    for rb in range(j, n_rb, 2 * P):  # two tiles in flight a trip
        o0, m0 = _tile(g, rb, True, C, M, BLOCK_L, BLOCK_C)
        o1, m1 = _tile(g, rb + P, True, C, M, BLOCK_L, BLOCK_C)
        x0 = tl.load(x_ptr + o0, mask=m0, other=0.0, eviction_policy="evict_last")
        x1 = tl.load(x_ptr + o1, mask=m1, other=0.0, eviction_policy="evict_last")
        d0 = tl.where(m0, x0.to(acc_ty) - shift[None, :], 0.0)
        d1 = tl.where(m1, x1.to(acc_ty) - shift[None, :], 0.0)
        acc1 += d0 + d1
        acc2 += d0 * d0 + d1 * d1
    tl.store(part_ptr + j * C + cols, tl.sum(acc1, axis=0), mask=cmask)
    tl.store(part_ptr + (P + j) * C + cols, tl.sum(acc2, axis=0), mask=cmask)
    if j == 0:
        tl.store(part_ptr + 2 * P * C + cols, shift, mask=cmask)
    sync_g, n_teams = _sync_base(sync_ptr, g, P, TEAM)
    if _arrive(part_ptr, team_ptr, sync_g, n_teams, j, P, C, cols, cmask, acc_ty, TEAM,
               BLOCK_C):
        s1 = _sum_partials(team_ptr, 0, n_teams, C, cols, cmask, acc_ty, TEAM, BLOCK_C)
        s2 = _sum_partials(team_ptr, n_teams, n_teams, C, cols, cmask, acc_ty, TEAM, BLOCK_C)
        k = tl.load(part_ptr + 2 * P * C + cols, mask=cmask, other=0.0, cache_modifier=".cg")
        _stats_from_sums(s1, s2, k, cols, cmask, M, eps, momentum, mean_ptr, rstd_ptr,
                         rmean_ptr, rvar_ptr, UPDATE)
        _publish(sync_g, n_teams)


@triton.jit
def _fwd_loads(x_ptr, res_ptr, g, rb_a, ok_a, rb_b, ok_b, C, M, HAS_RES: tl.constexpr,
               BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    o_a, m_a = _tile(g, rb_a, ok_a, C, M, BLOCK_L, BLOCK_C)
    o_b, m_b = _tile(g, rb_b, ok_b, C, M, BLOCK_L, BLOCK_C)
    x_a = tl.load(x_ptr + o_a, mask=m_a, other=0.0, eviction_policy="evict_first")
    x_b = tl.load(x_ptr + o_b, mask=m_b, other=0.0, eviction_policy="evict_first")
    r_a = x_a
    r_b = x_b
    if HAS_RES:
        r_a = tl.load(res_ptr + o_a, mask=m_a, other=0.0, eviction_policy="evict_first")
        r_b = tl.load(res_ptr + o_b, mask=m_b, other=0.0, eviction_policy="evict_first")
    return x_a, r_a, x_b, r_b


@triton.jit
def _fwd_store(x, res, g, rb, valid, y_ptr, bits_ptr, mean, scale, bias, C, M, NB,
               HAS_RES: tl.constexpr, RELU: tl.constexpr, BLOCK_L: tl.constexpr,
               BLOCK_C: tl.constexpr):
    """y (and its mask bits) of one loaded tile."""
    offs, m = _tile(g, rb, valid, C, M, BLOCK_L, BLOCK_C)
    y = (x.to(mean.dtype) - mean[None, :]) * scale[None, :] + bias[None, :]
    if HAS_RES:
        y += res.to(mean.dtype)
    if RELU:
        y = tl.where(y < 0.0, 0.0, y)  # not max(): NaN propagates as in torch.relu
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=m, eviction_policy="evict_first")
    if RELU:
        b_offs, bm = _bits_tile(g, rb, valid, M, NB, BLOCK_L, BLOCK_C)
        tl.store(bits_ptr + b_offs, _pack_bits(y > 0.0, BLOCK_L, BLOCK_C), mask=bm)


@triton.jit
def _fwd_apply(x_ptr, res_ptr, y_ptr, bits_ptr, w_ptr, b_ptr, sync_ptr, mean_ptr, rstd_ptr,
               g, j, n_rb, C, M, NB, P,
               HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr,
               RELU: tl.constexpr, TEAM: tl.constexpr, BLOCK_L: tl.constexpr,
               BLOCK_C: tl.constexpr):
    """Phase 2 of group g: y = act((x - mean) * rstd * w + b + res) over program j's rows,
    latest first (the freshest in L2), two tiles a trip and the next trip's loads in flight."""
    count = _n_blocks(j, n_rb, P)
    rb_a, ok_a, rb_b, ok_b = _trip(j, 0, count, P)
    x_a, r_a, x_b, r_b = _fwd_loads(x_ptr, res_ptr, g, rb_a, ok_a, rb_b, ok_b, C, M, HAS_RES,
                                    BLOCK_L, BLOCK_C)  # before the wait: they need no stats
    sync_g, n_teams = _sync_base(sync_ptr, g, P, TEAM)
    _wait(sync_g, n_teams, P)
    cols = g * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0, cache_modifier=".cg")
    scale = tl.load(rstd_ptr + cols, mask=cmask, other=0.0, cache_modifier=".cg")
    if HAS_W:
        scale *= tl.load(w_ptr + cols, mask=cmask, other=0.0).to(mean.dtype)
    bias = tl.zeros_like(mean)
    if HAS_B:
        bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(mean.dtype)
    for k in range(0, count, 2):
        rb_a, ok_a, rb_b, ok_b = _trip(j, k, count, P)
        na, nb, nc, nd = _trip(j, k + 2, count, P)
        xn_a, rn_a, xn_b, rn_b = _fwd_loads(x_ptr, res_ptr, g, na, nb, nc, nd, C, M, HAS_RES,
                                            BLOCK_L, BLOCK_C)
        _fwd_store(x_a, r_a, g, rb_a, ok_a, y_ptr, bits_ptr, mean, scale, bias, C, M, NB,
                   HAS_RES, RELU, BLOCK_L, BLOCK_C)
        _fwd_store(x_b, r_b, g, rb_b, ok_b, y_ptr, bits_ptr, mean, scale, bias, C, M, NB,
                   HAS_RES, RELU, BLOCK_L, BLOCK_C)
        x_a, r_a, x_b, r_b = xn_a, rn_a, xn_b, rn_b


@triton.jit(do_not_specialize=["M", "NB", "P"])
def _grouped_fwd_kernel(
    x_ptr, res_ptr, y_ptr,  # (N*H*W, C) channels_last: input, residual (HAS_RES), output
    bits_ptr,               # (N*H*W, NB) uint8 out: bit set where y > 0 (RELU)
    w_ptr, b_ptr,           # (C,) affine weight and bias (HAS_W / HAS_B)
    part_ptr,               # (2P + 1, C) fp32/fp64 scratch: partial shifted sums; the shift K
    team_ptr,               # (2 * n_teams, C) scratch: the teams' sums
    sync_ptr,               # (n_g * (n_teams + 3),) int32 zeros (module docstring)
    mean_ptr, rstd_ptr,     # (C,) out: batch mean, 1/sqrt(biased var + eps)
    rmean_ptr, rvar_ptr,    # (C,) running stats, blended in place (UPDATE)
    C, M, NB, P, eps, momentum,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr, RELU: tl.constexpr,
    UPDATE: tl.constexpr, LAG: tl.constexpr, TEAM: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    j = tl.program_id(0)
    n_g = tl.cdiv(C, BLOCK_C)
    n_rb = tl.cdiv(M, BLOCK_L)
    for step in range(0, n_g + LAG):
        if step < n_g:
            _fwd_sums(x_ptr, part_ptr, team_ptr, sync_ptr, mean_ptr, rstd_ptr, rmean_ptr,
                      rvar_ptr, step, j, n_rb, C, M, P, eps, momentum, UPDATE, TEAM, BLOCK_L,
                      BLOCK_C)
        if step >= LAG:
            _fwd_apply(x_ptr, res_ptr, y_ptr, bits_ptr, w_ptr, b_ptr, sync_ptr, mean_ptr,
                       rstd_ptr, step - LAG, j, n_rb, C, M, NB, P, HAS_W, HAS_B, HAS_RES,
                       RELU, TEAM, BLOCK_L, BLOCK_C)


# ---- backward ----

@triton.jit
def _bwd_loads(dy_ptr, x_ptr, bits_ptr, g, rb, valid, C, M, NB, policy: tl.constexpr,
               RELU: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """dy, x and the packed mask bytes of row block rb of group g (zeros outside the tensor)."""
    offs, m = _tile(g, rb, valid, C, M, BLOCK_L, BLOCK_C)
    dy = tl.load(dy_ptr + offs, mask=m, other=0.0, eviction_policy=policy)
    x = tl.load(x_ptr + offs, mask=m, other=0.0, eviction_policy=policy)
    if RELU:
        b_offs, bm = _bits_tile(g, rb, valid, M, NB, BLOCK_L, BLOCK_C)
        packed = tl.load(bits_ptr + b_offs, mask=bm, other=0, eviction_policy=policy)
    else:
        packed = tl.zeros((BLOCK_L, BLOCK_C // 8), tl.uint8)
    return dy, x, packed


@triton.jit
def _dz(dy, packed, acc_ty: tl.constexpr, RELU: tl.constexpr, BLOCK_L: tl.constexpr,
        BLOCK_C: tl.constexpr):
    """dy * [y > 0] (ReLU) in the statistics dtype."""
    dz = dy.to(acc_ty)
    if RELU:
        dz = tl.where(_unpack_bits(packed, BLOCK_L, BLOCK_C), dz, 0.0)
    return dz


@triton.jit
def _bwd_sums(dy_ptr, x_ptr, bits_ptr, mean_ptr, rstd_ptr, part_ptr, team_ptr, sync_ptr,
              dw_ptr, db_ptr, g, j, n_rb, C, M, NB, P,
              RELU: tl.constexpr, TEAM: tl.constexpr, BLOCK_L: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """Phase 1 of group g: sum(dz), sum(dz * (x - mean)) over program j's rows; the finishing
    program writes dbias and dweight = sum(dz * x_hat) and publishes them."""
    cols = g * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0)
    acc_dz = tl.zeros((BLOCK_L, BLOCK_C), mean.dtype)
    acc_dzx = tl.zeros((BLOCK_L, BLOCK_C), mean.dtype)
    for rb in range(j, n_rb, 2 * P):  # two tiles in flight a trip
        dy0, x0, p0 = _bwd_loads(dy_ptr, x_ptr, bits_ptr, g, rb, True, C, M, NB, "evict_last",
                                 RELU, BLOCK_L, BLOCK_C)
        dy1, x1, p1 = _bwd_loads(dy_ptr, x_ptr, bits_ptr, g, rb + P, True, C, M, NB,
                                 "evict_last", RELU, BLOCK_L, BLOCK_C)
        dz0 = _dz(dy0, p0, mean.dtype, RELU, BLOCK_L, BLOCK_C)
        dz1 = _dz(dy1, p1, mean.dtype, RELU, BLOCK_L, BLOCK_C)
        acc_dz += dz0 + dz1
        # outside the tensor dz is 0, so the x - mean there adds nothing
        acc_dzx += dz0 * (x0.to(mean.dtype) - mean[None, :]) \
            + dz1 * (x1.to(mean.dtype) - mean[None, :])
    tl.store(part_ptr + j * C + cols, tl.sum(acc_dz, axis=0), mask=cmask)
    tl.store(part_ptr + (P + j) * C + cols, tl.sum(acc_dzx, axis=0), mask=cmask)
    sync_g, n_teams = _sync_base(sync_ptr, g, P, TEAM)
    if _arrive(part_ptr, team_ptr, sync_g, n_teams, j, P, C, cols, cmask, mean.dtype, TEAM,
               BLOCK_C):
        rstd = tl.load(rstd_ptr + cols, mask=cmask, other=0.0)
        sum_dz = _sum_partials(team_ptr, 0, n_teams, C, cols, cmask, mean.dtype, TEAM, BLOCK_C)
        sum_dzx = _sum_partials(team_ptr, n_teams, n_teams, C, cols, cmask, mean.dtype, TEAM,
                                BLOCK_C)
        tl.store(dw_ptr + cols, sum_dzx * rstd, mask=cmask)
        tl.store(db_ptr + cols, sum_dz, mask=cmask)
        _publish(sync_g, n_teams)


@triton.jit
def _bwd_store(dy, x, packed, g, rb, valid, dx_ptr, dres_ptr, mean, a, mean_dz, k_x, C, M,
               HAS_RES: tl.constexpr, RELU: tl.constexpr, BLOCK_L: tl.constexpr,
               BLOCK_C: tl.constexpr):
    """dx (and d_residual) of one loaded tile."""
    offs, m = _tile(g, rb, valid, C, M, BLOCK_L, BLOCK_C)
    dz = _dz(dy, packed, mean.dtype, RELU, BLOCK_L, BLOCK_C)
    xm = x.to(mean.dtype) - mean[None, :]
    dx = a[None, :] * (dz - mean_dz[None, :] - xm * k_x[None, :])
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=m, eviction_policy="evict_first")
    if HAS_RES:
        tl.store(dres_ptr + offs, dz.to(dres_ptr.dtype.element_ty), mask=m,
                 eviction_policy="evict_first")


@triton.jit
def _bwd_apply(dy_ptr, x_ptr, bits_ptr, mean_ptr, rstd_ptr, w_ptr, dw_ptr, db_ptr, dx_ptr,
               dres_ptr, sync_ptr, g, j, n_rb, C, M, NB, P,
               HAS_W: tl.constexpr, HAS_RES: tl.constexpr, RELU: tl.constexpr,
               TEAM: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    """Phase 2 of group g: dx = a * (dz - mean(dz) - x_hat * mean(dz * x_hat)), a = w * rstd,
    and d_residual = dz over program j's rows, latest first, as _fwd_apply."""
    count = _n_blocks(j, n_rb, P)
    rb_a, ok_a, rb_b, ok_b = _trip(j, 0, count, P)
    dy_a, x_a, p_a = _bwd_loads(dy_ptr, x_ptr, bits_ptr, g, rb_a, ok_a, C, M, NB, "evict_first",
                                RELU, BLOCK_L, BLOCK_C)
    dy_b, x_b, p_b = _bwd_loads(dy_ptr, x_ptr, bits_ptr, g, rb_b, ok_b, C, M, NB, "evict_first",
                                RELU, BLOCK_L, BLOCK_C)
    sync_g, n_teams = _sync_base(sync_ptr, g, P, TEAM)
    _wait(sync_g, n_teams, P)
    cols = g * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0)
    rstd = tl.load(rstd_ptr + cols, mask=cmask, other=0.0)
    a = rstd
    if HAS_W:
        a = rstd * tl.load(w_ptr + cols, mask=cmask, other=0.0).to(mean.dtype)
    n = tl.zeros((), mean.dtype) + M
    mean_dz = tl.load(db_ptr + cols, mask=cmask, other=0.0, cache_modifier=".cg") / n
    k_x = rstd * tl.load(dw_ptr + cols, mask=cmask, other=0.0, cache_modifier=".cg") / n
    for k in range(0, count, 2):
        rb_a, ok_a, rb_b, ok_b = _trip(j, k, count, P)
        na, nb, nc, nd = _trip(j, k + 2, count, P)
        dyn_a, xn_a, pn_a = _bwd_loads(dy_ptr, x_ptr, bits_ptr, g, na, nb, C, M, NB,
                                       "evict_first", RELU, BLOCK_L, BLOCK_C)
        dyn_b, xn_b, pn_b = _bwd_loads(dy_ptr, x_ptr, bits_ptr, g, nc, nd, C, M, NB,
                                       "evict_first", RELU, BLOCK_L, BLOCK_C)
        _bwd_store(dy_a, x_a, p_a, g, rb_a, ok_a, dx_ptr, dres_ptr, mean, a, mean_dz, k_x, C, M,
                   HAS_RES, RELU, BLOCK_L, BLOCK_C)
        _bwd_store(dy_b, x_b, p_b, g, rb_b, ok_b, dx_ptr, dres_ptr, mean, a, mean_dz, k_x, C, M,
                   HAS_RES, RELU, BLOCK_L, BLOCK_C)
        dy_a, x_a, p_a, dy_b, x_b, p_b = dyn_a, xn_a, pn_a, dyn_b, xn_b, pn_b


@triton.jit(do_not_specialize=["M", "NB", "P"])
def _grouped_bwd_kernel(
    dy_ptr, x_ptr,          # (N*H*W, C) channels_last: output gradient, the forward input
    bits_ptr,               # (N*H*W, NB) uint8 ReLU mask bits (RELU)
    mean_ptr, rstd_ptr,     # (C,) batch statistics of the forward
    w_ptr,                  # (C,) weight (HAS_W)
    part_ptr,               # (2P, C) scratch: per-program sum(dz), sum(dz * (x - mean))
    team_ptr,               # (2 * n_teams, C) scratch: the teams' sums
    sync_ptr,               # (n_g * (n_teams + 3),) int32 zeros (module docstring)
    dw_ptr, db_ptr,         # (C,) out: dweight, dbias
    dx_ptr, dres_ptr,       # (N*H*W, C) out: input gradient, residual gradient (HAS_RES)
    C, M, NB, P,
    HAS_W: tl.constexpr, HAS_RES: tl.constexpr, RELU: tl.constexpr, LAG: tl.constexpr,
    TEAM: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    j = tl.program_id(0)
    n_g = tl.cdiv(C, BLOCK_C)
    n_rb = tl.cdiv(M, BLOCK_L)
    for step in range(0, n_g + LAG):
        if step < n_g:
            _bwd_sums(dy_ptr, x_ptr, bits_ptr, mean_ptr, rstd_ptr, part_ptr, team_ptr, sync_ptr,
                      dw_ptr, db_ptr, step, j, n_rb, C, M, NB, P, RELU, TEAM, BLOCK_L, BLOCK_C)
        if step >= LAG:
            _bwd_apply(dy_ptr, x_ptr, bits_ptr, mean_ptr, rstd_ptr, w_ptr, dw_ptr, db_ptr,
                       dx_ptr, dres_ptr, sync_ptr, step - LAG, j, n_rb, C, M, NB, P, HAS_W,
                       HAS_RES, RELU, TEAM, BLOCK_L, BLOCK_C)
