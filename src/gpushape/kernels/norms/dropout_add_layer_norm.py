"""Dropout, residual add and LayerNorm in one kernel each way: y = LayerNorm(dropout(x, p) +
residual) * weight + bias, the output of a post-norm transformer block (BERT's `SelfOutput` and
`Output`: `LayerNorm(dropout(dense(h)) + input)`).

The dropout mask is never stored: the forward draws one int64 seed from torch's generator on x's
device (no host sync, CUDA-graph safe; torch.manual_seed makes a run repeatable) and the backward
regenerates the mask from it, eight columns per Philox call (`attention/_philox.py`). The mask
is a different draw from nn.Dropout's, with the same drop probability (p rounded to a multiple
of 1/65536); rounding follows PyTorch's: x / (1 - p) and the sum are rounded to x's dtype, the
statistics and the affine step are float32 (float64 for float64 inputs).

Bytes (S = x's size): forward reads x and residual and writes s and y (4 S); backward reads dy
and s and writes the residual's and x's gradients (4 S). Eager PyTorch runs three kernels and
stores a mask; Inductor (torch 2.11) fuses them but spends one Philox call per element.

Layers: launch plans and launchers, the reference for CPU tensors, the custom ops with fake and
autograd (plain tensors outside torch.compile take an eager autograd.Function to the same
launchers), the functional `dropout_add_layer_norm`. Rows wider than MAX_N run the unfused ops.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._dispatch import check_float, check_same_device, eager_path, functorch_active, use_triton
from .._launch import Launch, aligned
from ..attention._philox import check_p, draw_seed, drop_threshold, dropout_keep_mask
from ._common import empty_if_none, fake_param_grad
from ._launch import _sum_launch, _tl_acc, sm_count
from ._reference import ACT_NONE, reference_backward, reference_forward, stat_dtype
from ._tuning import cdiv, pow2, tuning

OP = "dropout_add_layer_norm"
MAX_N = 8192  # widest row held in registers; wider rows run F.dropout, add and F.layer_norm


class DropoutLaunch(NamedTuple):
    """Launch shape of both kernels for rows of width N (benchmarks may swap it: `CONFIG`)."""

    fwd_tile_elems: int = 2048  # rows per forward program: this many elements over pow2(N)
    fwd_elems_per_thread: int = 8
    bwd_tile_elems: int = 1024
    bwd_elems_per_thread: int = 8
    bwd_programs_per_sm: int = 8
    # dweight / dbias from the (P, N) partials: narrow column blocks, so that many programs share
    # the read (32 columns gave BERT-base's 768 columns 24 programs: 17 us a call on an H100)
    sum_block_n: int = 8
    sum_block_p: int = 64


CONFIG = DropoutLaunch()


def _warps(elems: int, per_thread: int) -> int:
    return max(1, min(16, pow2(max(1, elems // (32 * per_thread)))))


# ---- launch plans ---------------------------------------------------------------------------
# Plans are keyed on every tensor's dtype: a Launch calls the kernel compiled for its first
# call's pointer types directly afterwards (`_launch.Launch`).
@functools.lru_cache(maxsize=256)
def _forward_launch(m, n, dtypes, drop, acc, device, config) -> Launch:
    from ._dropout_kernels import _dropout_add_ln_fwd_kernel

    block_m = max(1, min(pow2(m), config.fwd_tile_elems // pow2(n)))
    has_w, has_b = dtypes[1] is not None, dtypes[2] is not None
    meta = dict(HAS_W=has_w, HAS_B=has_b, DROP=drop, ACC=_tl_acc(acc), BLOCK_M=block_m,
                GROUPS=max(1, pow2(n) // 8),
                num_warps=_warps(block_m * pow2(n), config.fwd_elems_per_thread))  # fmt: skip
    return Launch(_dropout_add_ln_fwd_kernel, (cdiv(m, block_m),), meta)


@functools.lru_cache(maxsize=256)
def _backward_launch(m, n, dtypes, drop, acc, device, config) -> tuple[Launch, int, int]:
    """(launch, programs P, tiles per program)."""
    has_w, has_b = dtypes[2] is not None, dtypes[3] is not None
    from ._dropout_kernels import _dropout_add_ln_bwd_kernel

    block_m = max(1, min(pow2(m), config.bwd_tile_elems // pow2(n)))
    tiles = cdiv(m, block_m)
    programs = max(1, min(tiles, sm_count(device) * config.bwd_programs_per_sm))
    per_program = cdiv(tiles, programs)
    programs = cdiv(tiles, per_program)  # no program without a tile
    meta = dict(HAS_W=has_w, HAS_B=has_b, DROP=drop, ACC=_tl_acc(acc), BLOCK_M=block_m,
                GROUPS=max(1, pow2(n) // 8),
                num_warps=_warps(block_m * pow2(n), config.bwd_elems_per_thread))  # fmt: skip
    return Launch(_dropout_add_ln_bwd_kernel, (programs,), meta), programs, per_program


def _dtype(t: Tensor | None) -> torch.dtype | None:
    return None if t is None else t.dtype


def _kernels(t: Tensor) -> bool:
    """Triton for CUDA tensors (and CPU ones under TRITON_INTERPRET=1), float64 excepted: a
    kernel's float arguments (1 / (1 - p), eps) are float32, so float64 inputs (gradient checks)
    take the reference, which is exact to float64."""
    return t.dtype != torch.float64 and use_triton(t)


def _scale(p: float) -> float:
    return 1.0 / (1.0 - p) if p > 0 else 1.0


# ---- launchers --------------------------------------------------------------------------------
def forward(x, residual, weight, bias, eps: float, p: float, seed):
    """(y, s, mean, rstd) for contiguous x and residual; seed: (1,) int64, read when p > 0."""
    n = x.shape[-1]
    m = x.numel() // n
    acc = stat_dtype(x.dtype)
    if not _kernels(x):
        return _reference_forward(x, residual, weight, bias, eps, p, seed)
    y, s = torch.empty_like(x), torch.empty_like(x)
    mean = torch.empty(x.shape[:-1], dtype=acc, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=acc, device=x.device)
    if m == 0:
        return y, s, mean, rstd
    dtypes = (x.dtype, _dtype(weight), _dtype(bias))
    launch = _forward_launch(m, n, dtypes, p > 0, acc, x.device, CONFIG)
    ptrs = (x, residual, s, y, x if weight is None else weight, x if bias is None else bias,
            mean, rstd, x if seed is None else seed)  # fmt: skip
    launch(aligned(x, residual, weight, bias), *ptrs, m, n, eps, drop_threshold(p), _scale(p))
    return y, s, mean, rstd


def backward(dy, s, weight, bias, mean, rstd, seed, p: float):
    """(dx, dresidual, dweight, dbias); dx is a 0-element tensor where p == 0 (dresidual is)."""
    if not _kernels(s):
        return _reference_backward(dy, s, weight, bias, mean, rstd, seed, p)
    dy = dy.contiguous()
    n = s.shape[-1]
    m = s.numel() // n
    acc = stat_dtype(s.dtype)
    dres = torch.empty_like(s)
    dx = torch.empty_like(s) if p > 0 else s.new_empty(0)
    if m == 0:
        zeros = [None if t is None else torch.zeros_like(t) for t in (weight, bias)]
        return dx, dres, *zeros
    dtypes = (dy.dtype, s.dtype, _dtype(weight), _dtype(bias))
    launch, programs, per_program = _backward_launch(m, n, dtypes, p > 0, acc, s.device, CONFIG)
    parts = [None if t is None else torch.empty((programs, n), dtype=acc, device=s.device)
             for t in (weight, bias)]  # fmt: skip
    dw_part, db_part = parts
    launch(aligned(dy, s, weight, mean, rstd), dy, s, s if weight is None else weight, mean,
           rstd, s if seed is None else seed, dres, dres if p == 0 else dx,
           rstd if dw_part is None else dw_part, rstd if db_part is None else db_part,
           m, n, per_program, drop_threshold(p), _scale(p))  # fmt: skip
    sums = dataclasses.replace(tuning(), sum_block_n=CONFIG.sum_block_n,
                               sum_block_p=CONFIG.sum_block_p)  # fmt: skip
    summed = _sum_launch(programs, n, weight, bias, acc, sums)
    if summed is None:
        return dx, dres, None, None
    dw = None if weight is None else torch.empty_like(weight)
    db = None if bias is None else torch.empty_like(bias)
    part = dw_part if dw_part is not None else db_part
    summed(True, part, part if db_part is None else db_part, dw if dw is not None else db,
           db if db is not None else dw, programs, n)  # fmt: skip
    return dx, dres, dw, db


# ---- reference (CPU tensors without TRITON_INTERPRET) ------------------------------------------
def _reference_forward(x, residual, weight, bias, eps, p, seed):
    if p > 0:
        x = torch.where(dropout_keep_mask(seed, x.shape, p, x.device), x * _scale(p), 0.0).to(
            x.dtype
        )
    out = reference_forward(x, residual, weight, bias, eps, act=ACT_NONE, rms=False)
    return out.y, out.s, out.mean, out.rstd


def _reference_backward(dy, s, weight, bias, mean, rstd, seed, p):
    dres, dw, db = reference_backward(dy, None, s, weight, bias, mean, rstd, act=ACT_NONE,
                                      rms=False)  # fmt: skip
    if p == 0:
        return s.new_empty(0), dres, dw, db
    dx = torch.where(dropout_keep_mask(seed, s.shape, p, s.device), dres * _scale(p), 0.0).to(
        s.dtype
    )
    return dx, dres, dw, db


# ---- custom ops: fake and autograd ------------------------------------------------------------
@torch.library.custom_op("gpushape::dropout_add_layer_norm", mutates_args=())
def _op(
    x: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
    p: float, seed: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    return forward(x, residual, weight, bias, eps, p, seed)


@_op.register_fake
def _(x, residual, weight, bias, eps, p, seed):
    stats = [x.new_empty(x.shape[:-1], dtype=stat_dtype(x.dtype)) for _ in range(2)]
    return x.new_empty(x.shape), x.new_empty(x.shape), *stats


@torch.library.custom_op("gpushape::dropout_add_layer_norm_backward", mutates_args=())
def _backward_op(
    dy: Tensor, s: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
    rstd: Tensor, seed: Tensor | None, p: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    dx, dres, dw, db = backward(dy, s, weight, bias, mean, rstd, seed, p)
    return dx, dres, empty_if_none(dw, s), empty_if_none(db, s)


@_backward_op.register_fake
def _(dy, s, weight, bias, mean, rstd, seed, p):
    dx = s.new_empty(s.shape) if p > 0 else s.new_empty(0)
    return dx, s.new_empty(s.shape), fake_param_grad(weight, s), fake_param_grad(bias, s)


def _setup_context(ctx, inputs, output):
    _x, _residual, weight, bias, _eps, p, seed = inputs
    _, s, mean, rstd = output
    ctx.save_for_backward(s, weight, bias, mean, rstd, seed)
    ctx.p = p
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, _ds, _dmean, _drstd):
    s, weight, bias, mean, rstd, seed = ctx.saved_tensors
    if dy is None:
        return None, None, None, None, None, None, None
    dx, dres, dw, db = _backward_op(dy, s, weight, bias, mean, rstd, seed, ctx.p)
    dx = dres if ctx.p == 0 else dx  # no dropout: one gradient serves x and residual, as for an add
    dw = None if weight is None else dw
    db = None if bias is None else db
    return dx, dres, dw, db, None, None, None


_op.register_autograd(_backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """Plain tensors outside torch.compile: straight to the launchers (the custom ops' Python
    dispatch costs more host time than these kernels take on the GPU)."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, p, seed):
        y, s, mean, rstd = forward(x, residual, weight, bias, eps, p, seed)
        ctx.save_for_backward(s, weight, bias, mean, rstd, seed)
        ctx.p = p
        return y

    @staticmethod
    @once_differentiable  # the backward's kernels have no derivative of their own
    def backward(ctx, dy):
        s, weight, bias, mean, rstd, seed = ctx.saved_tensors
        dx, dres, dw, db = backward(dy, s, weight, bias, mean, rstd, seed, ctx.p)
        return dres if ctx.p == 0 else dx, dres, dw, db, None, None, None


# ---- functional ---------------------------------------------------------------------------------
def _check(x, residual, weight, bias, eps, p) -> None:
    for name, t in (("x", x), ("residual", residual)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{OP}: {name} must be a tensor, got {type(t).__name__}")
    check_same_device(OP, x=x, residual=residual, weight=weight, bias=bias)
    check_float(OP, x=x, residual=residual, weight=weight, bias=bias)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{OP}: x of shape {tuple(x.shape)} has no features to normalise")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"{OP}: residual is {tuple(residual.shape)} {residual.dtype}, expected x's "
            f"{tuple(x.shape)} {x.dtype}"
        )
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (n,):
            raise ValueError(f"{OP}: {name} has shape {tuple(t.shape)}, expected ({n},)")
    check_p(OP, p)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{OP}: eps must be a finite number >= 0, got {eps!r}")


def dropout_add_layer_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    p: float = 0.0,
    training: bool = True,
) -> Tensor:
    """layer_norm(dropout(x, p, training) + residual, (N,), weight, bias, eps) in one kernel.

    x, residual: (..., N), same shape and float dtype; weight, bias: (N,) or None.
    """
    _check(x, residual, weight, bias, eps, p)
    drop = bool(training) and p > 0
    if x.shape[-1] > MAX_N or functorch_active():
        h = F.dropout(x, p, training=drop) + residual
        return F.layer_norm(h, (x.shape[-1],), weight, bias, eps)
    seed = draw_seed(x.device) if drop else None
    args = (x.contiguous(), residual.contiguous(), weight, bias, float(eps),
            float(p) if drop else 0.0, seed)  # fmt: skip
    if eager_path(x):
        return _Eager.apply(*args)
    return _op(*args)[0]
