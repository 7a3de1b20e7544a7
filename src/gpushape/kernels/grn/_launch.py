"""Launchers of the GRN kernels: the (N, P, C) view of the input, tiles, pixel slices and grids,
worked out once per signature (a plan), so a call allocates its outputs and launches three
kernels (forward) or four (backward).

Traffic (S: the bytes of x, equal to those of y, dy and dx; the (N, C) terms are a few KB):
  forward:  read x (the sums), read x and write y (the scaling)         = 3 S
  backward: read dy and x (the sums), read dy and x and write dx        = 5 S
against about 35 S for the eager composition (norm, mean, divide, multiply, addcmul, add and
their backward ops). CPU tensors take the plain-PyTorch reference (`_reference.py`) unless
TRITON_INTERPRET=1.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._dispatch import use_triton
from .._launch import Launch, aligned
from .._pixels import View, acc_dtype, pow2, split, tile
from .._plan_cache import PlanCache
from ._kernels import (
    _grn_apply_kernel,
    _grn_param_grads_kernel,
    _grn_sample_kernel,
    _grn_sums_kernel,
)
from ._reference import reference_backward, reference_forward

SUMS_TILE = 4096  # elements a sums program reads a step
APPLY_TILE = 2048  # elements an elementwise program handles
SAMPLE_BLOCK_C = 1024  # channels the per-sample kernel takes a step
GRADS_BLOCK_N = 64  # the parameter gradients: samples a step
GRADS_TILE = 4096
_INT32_LIMIT = 2**31
_MAX_PLANS = 1024


def takes_as_is(x: torch.Tensor, channels_last: bool) -> bool:
    """Whether the kernels read x where it lies: dense in a layout whose two pixel dims merge
    into one (an (N, H, W, C) tensor contiguous; an (N, C, H, W) one contiguous or
    channels_last). y and dx then take x's strides; other inputs are copied contiguous first."""
    if x.is_contiguous():
        return True
    return not channels_last and x.is_contiguous(memory_format=torch.channels_last)


def dense(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """x as the kernels read it: itself where `takes_as_is`, else a contiguous copy."""
    return x if takes_as_is(x, channels_last) else x.contiguous()


def empty_out(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """An uninitialised tensor shaped and laid out as the kernels write y (or dx) for x: what
    the custom ops' fake implementations return too."""
    if takes_as_is(x, channels_last):
        return torch.empty_like(x)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def view(x: torch.Tensor, channels_last: bool) -> View:
    """The (N, P, C) view of a tensor `dense` returned."""
    if channels_last:
        n, h, w, c = x.shape
        sn, sh, sw, sc = x.stride()
    else:
        n, c, h, w = x.shape
        sn, sc, sh, sw = x.stride()
    sp = sw if w > 1 else sh
    return View(n, h * w, c, sn, sp, sc, sc == 1 or c == 1)


class Plan(NamedTuple):
    sums: Launch
    sample: Launch
    apply: Launch
    grads: Launch | None  # backward only
    p_per_split: int
    splits: int


_PLANS: PlanCache[Plan] = PlanCache(_MAX_PLANS)


def plan(
    backward: bool,
    v: View,
    dtype: torch.dtype,
    device: torch.device,
    param_dtypes: tuple[torch.dtype, ...] = (),
) -> Plan:
    """The cached launches of one direction for this view, x's dtype, the parameters' dtypes
    (the compiled launchers are called directly: each pointer's dtype is part of the key) and
    device."""
    key = (backward, v, dtype, device, param_dtypes)
    return _PLANS.get(key, _build, backward, v, dtype, device)


def _build(backward: bool, v: View, dtype: torch.dtype, device: torch.device) -> Plan:
    fp64 = dtype == torch.float64
    wide = v.n * v.p * v.c >= _INT32_LIMIT
    block_p, block_c, programs, p_per_split, splits = split(v, SUMS_TILE, device)
    sums = Launch(
        _grn_sums_kernel,
        (programs, splits),
        dict(
            BACKWARD=backward,
            ACC_FP64=fp64,
            BLOCK_P=block_p,
            BLOCK_C=block_c,
            WIDE=wide,
            num_warps=8,
        ),
    )
    sample_c = min(pow2(v.c), SAMPLE_BLOCK_C)
    sample = Launch(
        _grn_sample_kernel,
        v.n,
        dict(BACKWARD=backward, ACC_FP64=fp64, BLOCK_C=sample_c, num_warps=4),
    )
    ap, ac = tile(v, APPLY_TILE)
    apply = Launch(
        _grn_apply_kernel,
        v.n * -(-v.p // ap) * -(-v.c // ac),
        dict(
            BACKWARD=backward,
            ACC_FP64=fp64,
            BLOCK_P=ap,
            BLOCK_C=ac,
            CHANNELS_FASTEST=v.channels_fastest,
            WIDE=wide,
            num_warps=4,
        ),
    )
    grads = param_grads(v, fp64) if backward else None
    return Plan(sums, sample, apply, grads, p_per_split, splits)


def param_grads(v: View, fp64: bool) -> Launch:
    """The launch of `_grn_param_grads_kernel` for this view: the samples' (2, N, C) terms of
    a weight's and a bias's gradients summed in order (group norm's backward uses it too)."""
    grads_n = min(pow2(v.n), GRADS_BLOCK_N)
    grads_c = min(pow2(v.c), GRADS_TILE // grads_n)
    return Launch(
        _grn_param_grads_kernel,
        -(-v.c // grads_c),
        dict(ACC_FP64=fp64, BLOCK_N=grads_n, BLOCK_C=grads_c, num_warps=4),
    )


def grn_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, channels_last: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, g): y in x's dtype and layout, g (N, C) the per-channel L2 norms over the pixels in
    float32 (float64), which the backward reads. weight and bias: contiguous (C,)."""
    x = dense(x, channels_last)
    if not use_triton(x):
        return reference_forward(x, weight, bias, eps, channels_last)
    v = view(x, channels_last)
    acc = acc_dtype(x.dtype)
    y = torch.empty_like(x)
    if v.n * v.c == 0:
        return y, torch.empty((v.n, v.c), dtype=acc, device=x.device)
    g = torch.empty((v.n, v.c), dtype=acc, device=x.device)
    scale = torch.empty_like(g)
    if v.p == 0:  # no pixels: g = 0, y empty
        return y, g.zero_()
    p = plan(False, v, x.dtype, x.device, (weight.dtype, bias.dtype))
    ws = torch.empty((1, p.splits, v.n, v.c), dtype=acc, device=x.device)
    p.sums(aligned(x, ws), x, x, ws, v.n, v.p, v.c, v.sn, v.sp, v.sc, p.p_per_split, p.splits)
    p.sample(
        aligned(ws, g, weight, scale), ws, g, weight, scale, scale, scale, v.n, v.c, p.splits, eps
    )
    p.apply(aligned(x, y, scale, bias), x, x, y, scale, scale, bias, v.p, v.c, v.sn, v.sp, v.sc)
    return y, g


def grn_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    g: torch.Tensor,
    eps: float,
    channels_last: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx in x's dtype and layout, dweight, dbias in weight's dtype, shape (C,))."""
    x = dense(x, channels_last)
    if dy.stride() != x.stride():
        dy = torch.empty_like(x).copy_(dy)
    if not use_triton(x):
        return reference_backward(dy, x, weight, eps, channels_last)
    v = view(x, channels_last)
    dx = torch.empty_like(x)
    dw = torch.empty_like(weight)
    db = torch.empty_like(weight)
    if v.n * v.c * v.p == 0:  # nothing to sum: zero parameter gradients
        return dx, dw.zero_(), db.zero_()
    acc = acc_dtype(x.dtype)
    p = plan(True, v, x.dtype, x.device, (weight.dtype, dy.dtype))
    ws = torch.empty((2, p.splits, v.n, v.c), dtype=acc, device=x.device)
    scale = torch.empty((v.n, v.c), dtype=acc, device=x.device)
    coef = torch.empty_like(scale)
    parts = torch.empty((2, v.n, v.c), dtype=acc, device=x.device)
    p.sums(aligned(x, dy, ws), x, dy, ws, v.n, v.p, v.c, v.sn, v.sp, v.sc, p.p_per_split, p.splits)
    p.sample(
        aligned(ws, g, weight, scale, coef, parts),
        ws,
        g,
        weight,
        scale,
        coef,
        parts,
        v.n,
        v.c,
        p.splits,
        eps,
    )
    p.apply(
        aligned(dy, x, dx, scale, coef), dy, x, dx, scale, coef, scale, v.p, v.c, v.sn, v.sp, v.sc
    )
    p.grads(aligned(parts, dw, db), parts, dw, db, v.n, v.c)
    return dx, dw, db
