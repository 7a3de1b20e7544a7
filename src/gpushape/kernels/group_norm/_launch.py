"""Launchers of the group-norm kernels: the (N, P, C) view of the input, tiles, pixel slices and
grids worked out once per signature (a plan), so a call allocates its outputs and launches
three kernels (forward) or four (backward).

Traffic (S: the bytes of x, equal to those of dy and dx; y's in its own dtype; the (N, C)
coefficients are a few KB):
  forward:  read x (the sums), read x and write y (the scaling)                  = 3 S
  backward: read dy and x (the sums), read dy and x and write dx                 = 5 S
PyTorch's eager group norm moves about as many bytes (its backward reads dy and x twice too),
but takes its statistics with one thread block per (sample, group): 64 blocks on 132 SMs for a
one-group norm at batch 64. These kernels split the pixels until every SM has programs.
CPU tensors take the plain-PyTorch reference (`_reference.py`) unless TRITON_INTERPRET=1.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .._dispatch import use_triton
from .._launch import Launch, aligned
from .._pixels import View, acc_dtype, pow2, split, tile
from .._plan_cache import PlanCache
from ..grn._launch import param_grads
from ._kernels import _gn_apply_kernel, _gn_group_kernel, _gn_sums_kernel
from ._reference import reference_backward, reference_forward

SUMS_TILE = 4096  # elements a sums program reads a step
APPLY_TILE = 2048  # elements an elementwise program handles
GROUP_BLOCK_C = 1024  # channels the per-group kernel takes a step
_INT32_LIMIT = 2**31
_MAX_PLANS = 1024


def takes_as_is(x: torch.Tensor) -> bool:
    """Whether the kernels read x where it lies: contiguous, or a 4-D tensor in channels_last
    memory. y and dx then take x's strides; other inputs are copied contiguous first."""
    if x.is_contiguous():
        return True
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)


def dense(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels read it: itself where `takes_as_is`, else a contiguous copy."""
    return x if takes_as_is(x) else x.contiguous()


def empty_out(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised tensor shaped and laid out as the kernels write y (or dx) for x, in
    `dtype` (x's by default): what the custom ops' fake implementations return too."""
    dtype = dtype or x.dtype
    if takes_as_is(x):
        return torch.empty_like(x, dtype=dtype)
    return torch.empty(x.shape, dtype=dtype, device=x.device)


def view(x: torch.Tensor) -> View:
    """The (N, P, C) view of a tensor `dense` returned."""
    n, c = x.shape[0], x.shape[1]
    p = math.prod(x.shape[2:])
    if x.is_contiguous():
        return View(n, p, c, c * p, 1, p, c == 1 or p == 1)
    _, sc, sh, sw = x.stride()  # 4-D channels_last
    sp = sw if x.shape[3] > 1 else sh
    return View(n, p, c, x.stride(0), sp, sc, True)


class Plan(NamedTuple):
    sums: Launch
    group: Launch
    apply: Launch
    grads: Launch | None  # backward only
    p_per_split: int
    splits: int


_PLANS: PlanCache[Plan] = PlanCache(_MAX_PLANS)


def plan(
    backward: bool,
    v: View,
    groups: int,
    act: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device,
) -> Plan:
    """The cached launches of one direction for this view, group count, activation, the
    tensors' dtypes (the compiled launchers are called directly: each pointer's dtype is part
    of the key) and device."""
    key = (backward, v, groups, act, dtypes, device)
    return _PLANS.get(key, _build, backward, v, groups, act, dtypes[0], device)


def _build(
    backward: bool, v: View, groups: int, act: int, dtype: torch.dtype, device: torch.device
) -> Plan:
    fp64 = dtype == torch.float64
    wide = v.n * v.p * v.c >= _INT32_LIMIT
    block_p, block_c, programs, p_per_split, splits = split(v, SUMS_TILE, device)
    flags = dict(BACKWARD=backward, ACC_FP64=fp64)
    # rows of a 14x14 map start 392 bytes apart: Triton, seeing a stride it cannot divide by
    # 16, loads an element at a time unless told they are 4-element aligned
    rows = math.gcd(v.sn, v.sc) if v.sp == 1 and not v.channels_fastest else 1
    align = min(16, rows & -rows)
    sums = Launch(
        _gn_sums_kernel,
        (programs, splits),
        dict(
            flags,
            ACT=act,
            BLOCK_P=block_p,
            BLOCK_C=block_c,
            ALIGN=align,
            WIDE=wide,
            num_warps=8,
        ),
    )
    cpg = v.c // groups
    group = Launch(
        _gn_group_kernel,
        v.n * groups,
        dict(flags, BLOCK_C=min(pow2(cpg), GROUP_BLOCK_C), num_warps=4),
    )
    if v.channels_fastest or align * torch.finfo(dtype).bits >= 128:
        # 2-D tiles: channels contiguous, or NCHW rows 16-byte aligned (vector loads)
        layout, (ap, ac) = (0 if v.channels_fastest else 1), tile(v, APPLY_TILE)
        programs = v.n * -(-v.p // ap) * -(-v.c // ac)
    else:  # NCHW with rows off 16-byte alignment (a 14x14 map): flat (see _gn_apply_kernel)
        layout, ap, ac = 2, APPLY_TILE, 1
        programs = -(-v.n * v.c * v.p // APPLY_TILE)
    apply = Launch(
        _gn_apply_kernel,
        programs,
        dict(flags, ACT=act, BLOCK_P=ap, BLOCK_C=ac, LAYOUT=layout, WIDE=wide, num_warps=4),
    )
    grads = param_grads(v, fp64) if backward else None
    return Plan(sums, group, apply, grads, p_per_split, splits)


# The workspace of a call, float32 (float64): (N, C) tables, then the partial sums
# (2, SPLITS, N, C); forward: scale, bias, mean; backward: those, coef, const and the two
# parameter-gradient terms (`_kernels.py`'s FORWARD_WS, BACKWARD_WS). One allocation a call.
FORWARD_TABLES, BACKWARD_TABLES = 3, 7


def group_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    groups: int,
    eps: float,
    act: int,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, stats): y = act(group_norm(x)) in out_dtype and x's layout; stats (2, N, groups),
    the group means and 1/std in float32 (float64), which the backward reads. weight and bias:
    contiguous (C,) tensors (ones and zeros where the norm has none)."""
    x = dense(x)
    if not use_triton(x):
        return reference_forward(x, weight, bias, groups, eps, act, out_dtype)
    v = view(x)
    acc = acc_dtype(x.dtype)
    y = torch.empty_like(x, dtype=out_dtype)
    stats = torch.empty((2, v.n, groups), dtype=acc, device=x.device)
    if v.n * v.c == 0:
        return y, stats
    if v.p == 0:  # no pixels: a group of nothing has no statistics
        return y, stats.fill_(math.nan)
    p = plan(False, v, groups, act, (x.dtype, weight.dtype, bias.dtype, out_dtype), x.device)
    nc = v.n * v.c
    work = torch.empty((FORWARD_TABLES + 2 * p.splits) * nc, dtype=acc, device=x.device)
    cpg = v.c // groups
    sizes = (v.n, v.p, v.c, groups, cpg, v.sn, v.sp, v.sc, p.p_per_split, p.splits)
    p.sums(aligned(x, work), x, x, x, x, x, work, *sizes)
    p.group(
        aligned(work, stats, weight, bias),
        *(work, stats, weight, bias, v.n, v.p, v.c, groups, cpg, p.splits, p.p_per_split, eps),
    )
    numel = nc * v.p
    p.apply(aligned(x, y, work), x, x, y, work, v.n, v.p, v.c, numel, v.sn, v.sp, v.sc)
    return y, stats


def group_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    stats: torch.Tensor,
    groups: int,
    eps: float,
    act: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx in x's dtype and layout, dweight and dbias in weight's and bias's dtypes, (C,))."""
    x = dense(x)
    if dy.stride() != x.stride():
        dy = torch.empty_like(x, dtype=dy.dtype).copy_(dy)
    if not use_triton(x):
        return reference_backward(dy, x, weight, bias, groups, eps, act)
    v = view(x)
    dx = torch.empty_like(x)
    dw = torch.empty_like(weight)
    db = torch.empty_like(bias)
    if v.n * v.c * v.p == 0:  # nothing to sum: zero parameter gradients
        return dx, dw.zero_(), db.zero_()
    acc = acc_dtype(x.dtype)
    dtypes = (x.dtype, weight.dtype, bias.dtype, dy.dtype, dw.dtype, db.dtype)
    p = plan(True, v, groups, act, dtypes, x.device)
    nc = v.n * v.c
    work = torch.empty((BACKWARD_TABLES + 2 * p.splits) * nc, dtype=acc, device=x.device)
    cpg = v.c // groups
    sizes = (v.n, v.p, v.c, groups, cpg, v.sn, v.sp, v.sc, p.p_per_split, p.splits)
    p.sums(aligned(x, dy, stats, weight, bias, work), x, dy, stats, weight, bias, work, *sizes)
    p.group(
        aligned(work, stats, weight, bias),
        *(work, stats, weight, bias, v.n, v.p, v.c, groups, cpg, p.splits, p.p_per_split, 0.0),
    )
    numel = nc * v.p
    p.apply(aligned(x, dy, dx, work), x, dy, dx, work, v.n, v.p, v.c, numel, v.sn, v.sp, v.sc)
    parts = work[5 * nc :]
    p.grads(aligned(parts, dw, db), parts, dw, db, v.n, v.c)
    return dx, dw, db
