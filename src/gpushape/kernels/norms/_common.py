"""What the row-normalisation ops share: input checks, launch configuration, the Triton launchers
(the plain-PyTorch reference for CPU tensors is in `_reference.py`) and the module base.

Every op here normalises over the last dimension of x, seen as M rows of N features:
    layer_norm_gelu: y = gelu(LN(x) * w + b)          (act=GELU_ERF / GELU_TANH, rms=False)
    add_layer_norm:  s = x + r; y = LN(s) * w + b     (residual given)
    rms_norm:        y = x * rstd(x) * w              (rms=True)
The forward saves only the (M,) statistics; the backward recomputes x_hat (and the activation's
input) from x, mean, rstd, weight and bias.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .._dispatch import (
    FLOAT_DTYPES,
    check_float,
    check_same_device,
    eager_path,  # noqa: F401  (re-exported for the norm ops)
    functorch_active,
    use_triton,
)
from .._launch import aligned
from ._launch import backward_plan, forward_plan
from ._reference import (
    NormBackward,
    NormForward,
    reference_backward,
    reference_forward,
    stat_dtype,
)
from ._tuning import NormTuning, norm_tuning  # noqa: F401  (re-exported for callers)

_SUPPORTED_DEVICES = ("cpu", "cuda", "meta")


# ---------------------------------------------------------------------------------------------
# input checks (run by the functional forms, before the custom op, so errors read plainly)
# ---------------------------------------------------------------------------------------------
def _inputs_ok(x, weight, bias, eps, residual) -> bool:
    """The common case, checked cheaply: a float CUDA / CPU x with features, parameters of
    shape (N,) on its device, a float eps >= 0. False sends the inputs to the full check."""
    if (
        type(eps) is not float
        or not 0.0 <= eps < math.inf
        or x.dtype not in FLOAT_DTYPES
        or x.dim() == 0
    ):
        return False
    device, n = x.device, x.shape[-1]
    if n == 0 or device.type not in _SUPPORTED_DEVICES:
        return False
    for t in (weight, bias):
        if t is not None and (t.device != device or t.dtype not in FLOAT_DTYPES or t.shape != (n,)):
            return False
    return residual is None or (
        residual.device == device and residual.dtype == x.dtype and residual.shape == x.shape
    )


def check_norm_inputs(
    op: str,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
) -> None:
    if _inputs_ok(x, weight, bias, eps, residual):
        return
    tensors = {"x": x, "residual": residual, "weight": weight, "bias": bias}
    for name, t in tensors.items():
        if t is not None and t.device.type not in _SUPPORTED_DEVICES:
            raise RuntimeError(f"{op}: {name} is on {t.device}; expected CPU or CUDA tensors")
    check_same_device(op, **tensors)
    check_float(op, **tensors)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"{op}: x of shape {tuple(x.shape)} has no features to normalise; "
            f"the last dimension must hold at least one element"
        )
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (n,):
            raise ValueError(
                f"{op}: {name} has shape {tuple(t.shape)}, expected ({n},) to match "
                f"the last dimension of x {tuple(x.shape)}"
            )
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(
                f"{op}: residual has shape {tuple(residual.shape)}, expected x's "
                f"shape {tuple(x.shape)}"
            )
        if residual.dtype != x.dtype:
            raise TypeError(
                f"{op}: residual is {residual.dtype} but x is {x.dtype}; cast one so both match"
            )
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {eps!r}")


# ---------------------------------------------------------------------------------------------
# launchers: allocate the outputs, launch the cached plan (`_launch.py`)
# ---------------------------------------------------------------------------------------------
def norm_forward(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    act: int,
    rms: bool,
) -> NormForward:
    """Forward of every norm op: Triton on CUDA (and under TRITON_INTERPRET=1), else reference."""
    if not use_triton(x):
        return reference_forward(x, residual, weight, bias, eps, act=act, rms=rms)
    # The kernels index rows of a contiguous (M, N) block: any leading shape will do.
    x = x.contiguous()
    r, w, b = (None if t is None else t.contiguous() for t in (residual, weight, bias))
    if x.numel() == 0:
        return _empty_forward(x, r, rms)
    plan = forward_plan(x, r is not None, w, b, act=act, rms=rms)
    y = torch.empty_like(x)
    s = None if r is None else torch.empty_like(x)
    rstd = torch.empty(plan.lead, dtype=plan.acc, device=x.device)
    mean = None if rms else torch.empty(plan.lead, dtype=plan.acc, device=x.device)
    # Unused pointer arguments get x: Triton needs a tensor there, the kernel never touches it.
    ptrs = (
        x,
        x if r is None else r,
        x if s is None else s,
        y,
        x if w is None else w,
        x if b is None else b,
        rstd if mean is None else mean,
        rstd,
    )
    n = x.shape[-1]
    sizes = (n, eps) if plan.looped else (x.numel() // n, n, eps)
    plan.launch(aligned(x, r, w, b), *ptrs, *sizes)
    return NormForward(y, s, mean, rstd)


def _empty_forward(x, r, rms) -> NormForward:
    stats = [
        torch.empty(x.shape[:-1], dtype=stat_dtype(x.dtype), device=x.device) for _ in range(2)
    ]
    return NormForward(
        torch.empty_like(x),
        None if r is None else torch.empty_like(x),
        None if rms else stats[0],
        stats[1],
    )


def norm_backward(
    dy: torch.Tensor,
    ds: torch.Tensor | None,
    xs: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    *,
    act: int,
    rms: bool,
) -> NormBackward:
    """Backward of every norm op. xs is the normalised input (x + residual for add_layer_norm);
    ds, when given, is the gradient reaching that sum directly and is added to dx."""
    if not use_triton(xs):
        return reference_backward(dy, ds, xs, weight, bias, mean, rstd, act=act, rms=rms)
    # dy may be expanded (stride 0) or transposed: the kernels read contiguous rows.
    xs, dy, rstd = xs.contiguous(), dy.contiguous(), rstd.contiguous()
    ds, w, b, mean = (None if t is None else t.contiguous() for t in (ds, weight, bias, mean))
    dx = torch.empty_like(xs)
    n = xs.shape[-1]
    m = xs.numel() // n
    if m == 0:  # no rows: zero parameter gradients
        return NormBackward(dx, *(None if p is None else torch.zeros_like(p) for p in (w, b)))
    # dy's dtype: Triton compiled the plan's kernels for the pointer types it first saw
    plan = backward_plan(xs, (ds is not None, dy.dtype), w, b, act=act, rms=rms)
    mean = rstd if mean is None else mean  # RMSNorm: never read
    w_ptr, b_ptr = (xs if w is None else w), (xs if b is None else b)
    is_aligned = aligned(dy, ds, xs, w, b, mean, rstd)
    c1 = c2 = rstd  # unused on the single-block path
    if plan.row_sums is not None:
        c1 = torch.empty(m, dtype=plan.acc, device=xs.device)  # (M,) row means of g*xhat
        c2 = torch.empty(m, dtype=plan.acc, device=xs.device)  # (M,) and of g
        plan.row_sums(is_aligned, dy, xs, w_ptr, b_ptr, mean, rstd, c1, c2, n)
    parts = [
        None if p is None else torch.empty((plan.programs, n), dtype=plan.acc, device=xs.device)
        for p in (w, b)
    ]
    dw_part, db_part = parts  # (P, N) per-program column sums
    plan.main(
        is_aligned,
        dy,
        dy if ds is None else ds,
        xs,
        w_ptr,
        b_ptr,
        mean,
        rstd,
        c1,
        c2,
        dx,
        rstd if dw_part is None else dw_part,
        rstd if db_part is None else db_part,
        m,
        n,
        plan.tiles_per_program,
    )
    if plan.sum_partials is None:
        return NormBackward(dx, None, None)
    dw = None if w is None else torch.empty_like(w)
    db = None if b is None else torch.empty_like(b)
    part = dw_part if dw_part is not None else db_part
    plan.sum_partials(
        True,
        part,
        part if db_part is None else db_part,
        dw if dw is not None else db,
        db if db is not None else dw,
        plan.programs,
        n,
    )
    return NormBackward(dx, dw, db)


# ---------------------------------------------------------------------------------------------
# eager path: one autograd.Function straight to the launchers (the custom ops serve torch.compile)
# ---------------------------------------------------------------------------------------------
def run_eager(x, residual, weight, bias, eps: float, *, act: int, rms: bool):
    """y, or (y, s) when residual is given; autograd only when a gradient is wanted."""
    if functorch_active():
        out = reference_forward(x, residual, weight, bias, eps, act=act, rms=rms)
        return out.y if residual is None else (out.y, out.s)
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, residual, weight, bias)
    ):
        return _NormFunction.apply(x, residual, weight, bias, eps, act, rms)
    out = norm_forward(x, residual, weight, bias, eps, act=act, rms=rms)
    return out.y if residual is None else (out.y, out.s)


class _NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, act, rms):
        out = norm_forward(x, residual, weight, bias, eps, act=act, rms=rms)
        # add_layer_norm normalises s = x + residual: that is what the backward recomputes from
        ctx.save_for_backward(x if out.s is None else out.s, weight, bias, out.mean, out.rstd)
        ctx.act, ctx.rms, ctx.has_residual = act, rms, residual is not None
        ctx.set_materialize_grads(False)  # unused outputs get no zeros tensor to read back
        return out.y if out.s is None else (out.y, out.s)

    @staticmethod
    @once_differentiable  # the backward's kernels have no derivative of their own
    def backward(ctx, dy, ds=None):
        xs, weight, bias, mean, rstd = ctx.saved_tensors
        if dy is None:  # only the sum s was used downstream: d(x + residual) = ds
            return ds, ds, None, None, None, None, None
        dx, dw, db = norm_backward(dy, ds, xs, weight, bias, mean, rstd, act=ctx.act, rms=ctx.rms)
        # One tensor serves x and residual, as for any add; autograd never writes into it.
        return dx, dx if ctx.has_residual else None, dw, db, None, None, None


# ---------------------------------------------------------------------------------------------
# module base: the parameters of nn.LayerNorm / nn.RMSNorm, under the same names
# ---------------------------------------------------------------------------------------------
class AffineNorm(torch.nn.Module):
    """weight (ones) and optional bias (zeros) over the last dimension, named as in nn.LayerNorm,
    so a stock LayerNorm / RMSNorm state_dict loads into the fused module unchanged."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float,
        *,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        if len(shape) != 1:
            raise ValueError(
                f"{type(self).__name__} normalises the last dimension only; "
                f"normalized_shape must be one int, got {normalized_shape!r}"
            )
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(shape, **factory))
            self.bias = torch.nn.Parameter(torch.empty(shape, **factory)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


def contiguous_or_none(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def empty_if_none(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent weight's gradient travels as a 0-element tensor."""
    return like.new_empty(0) if t is None else t


def fake_param_grad(param: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """What a backward op's fake returns for a parameter's gradient (see empty_if_none)."""
    return like.new_empty(0) if param is None else param.new_empty(param.shape)


# ---------------------------------------------------------------------------------------------
# custom-op outputs and fakes, alike for every norm op
# ---------------------------------------------------------------------------------------------
def fake_forward(x: torch.Tensor, *, outputs: int, stats: int) -> tuple[torch.Tensor, ...]:
    """A forward op's fake: `outputs` tensors like x (y, and s for add_layer_norm), then `stats`
    per-row statistics (mean and rstd, or rstd alone), x.shape[:-1] in the statistics dtype."""
    return (
        *(x.new_empty(x.shape) for _ in range(outputs)),
        *(x.new_empty(x.shape[:-1], dtype=stat_dtype(x.dtype)) for _ in range(stats)),
    )


def op_grads(
    dx: torch.Tensor, like: torch.Tensor, *param_grads: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    """A backward op's outputs: dx, then each parameter's gradient (see empty_if_none)."""
    return (dx, *(empty_if_none(g, like) for g in param_grads))


def fake_grads(like: torch.Tensor, *params: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """A backward op's fake: dx like `like`, then one gradient per parameter (see op_grads)."""
    return (like.new_empty(like.shape), *(fake_param_grad(p, like) for p in params))
