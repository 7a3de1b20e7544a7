"""BatchNorm2d + residual add + activation as one fused op, forward and backward in Triton.

    y = act(batch_norm(x) * weight + bias + residual),  act in {"relu", "none"}

Training uses the batch statistics (fp32, fp64 for fp64 input) and blends the running stats as
torch does (unbiased variance, `momentum`); eval uses the running stats. Eager calls run the
implementations through one torch.autograd.Function (statistics and the fused pass, one cached
launch plan: `_launch.py`); under torch.compile these custom ops carry them
(CUDA-graph capture works on either path):
  gpushape::batch_norm_stats       mean, rstd of x; updates running stats in place (no autograd:
                                   called on x.detach())
  gpushape::batch_norm_act_apply   y and the ReLU mask bits, with a registered autograd whose
                                   backward (gpushape::batch_norm_act_backward) differentiates
                                   through the batch statistics when `training` is set
The backward derives the ReLU mask from 1 bit an element saved in the forward, so it never reads y.
CPU tensors take the plain-PyTorch reference (`_reference.py`), unless TRITON_INTERPRET=1 (then
the Triton kernels run in the interpreter). Traffic per pass: see `_launch.py`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._dispatch import (
    FLOAT_DTYPES,
    check_float,
    check_same_device,
    eager_path,
    functorch_active,
    use_triton,
)
from . import _launch as launch
from ._reference import apply_ref as _apply_ref
from ._reference import backward_ref as _backward_ref
from ._reference import stats_ref as _stats_ref

ACTIVATIONS = ("relu", "none")
_OP = "batch_norm_act"


# ---- implementations (Triton or reference), registered as custom ops below ----


def _stats(
    x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, momentum: float, eps: float
) -> tuple[Tensor, Tensor]:
    """Batch mean and 1/sqrt(var + eps) per channel; blends running stats in place if given."""
    if x.numel() == 0:  # as torch: nothing to normalise, running stats untouched
        zeros = x.new_zeros(x.shape[1], dtype=launch.stat_dtype(x))
        return zeros, zeros.clone()
    if use_triton(x):
        return launch.batch_stats(x, running_mean, running_var, momentum, eps)
    return _stats_ref(x, running_mean, running_var, momentum, eps)


def _apply(
    x: Tensor,
    mean: Tensor,
    stat: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    residual: Tensor | None,
    eps: float,
    training: bool,
    activation: str,
) -> tuple[Tensor, Tensor]:
    """(y, ReLU mask bits). `stat` is the batch rstd when training, else the running var.
    With training set the backward treats mean/stat as x's batch statistics."""
    relu = activation == "relu"
    if use_triton(x):
        return launch.apply(x, mean, stat, weight, bias, residual, eps, not training, relu)
    return _apply_ref(x, mean, stat, weight, bias, residual, eps, not training, relu)


def _backward_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    mean: Tensor,
    stat: Tensor,
    bits: Tensor,
    eps: float,
    training: bool,
    activation: str,
    res_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias, d_residual); dweight/dbias in the statistics dtype."""
    relu = activation == "relu"
    if x.numel() == 0:
        zeros = torch.zeros_like(mean)
        dres = torch.empty_like(x) if res_grad else x.new_empty((0,))
        return torch.empty_like(x), zeros, zeros.clone(), dres
    if use_triton(x):
        return launch.backward(dy, x, weight, mean, stat, bits, eps, training, relu, res_grad)
    return _backward_ref(dy, x, weight, mean, stat, bits, eps, training, relu, res_grad)


def _save(ctx, inputs, bits: Tensor) -> None:
    x, mean, stat, weight, bias, residual, eps, training, activation = inputs
    ctx.save_for_backward(x, weight, mean, stat, bits)
    ctx.eps, ctx.training, ctx.activation = eps, training, activation
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.has_residual = residual is not None


def _input_grads(ctx, dy: Tensor, backward_fn) -> tuple:
    """Gradients for (x, mean, stat, weight, bias, residual, eps, training, activation)."""
    x, weight, mean, stat, bits = ctx.saved_tensors
    relu = ctx.activation == "relu"
    dx, dw, db, dres = backward_fn(
        dy,
        x,
        weight,
        mean,
        stat,
        bits,
        ctx.eps,
        ctx.training,
        ctx.activation,
        ctx.has_residual and relu,
    )
    dweight = None if weight is None else dw if dw.dtype == weight.dtype else dw.to(weight.dtype)
    bias_dtype = ctx.bias_dtype
    dbias = None if bias_dtype is None else db if db.dtype == bias_dtype else db.to(bias_dtype)
    dresidual = (dres if relu else dy) if ctx.has_residual else None
    return dx, None, None, dweight, dbias, dresidual, None, None, None


def _forward(
    x,
    weight,
    bias,
    running_mean,
    running_var,
    residual,
    training: bool,
    momentum: float,
    eps: float,
    activation: str,
) -> tuple[Tensor, ...]:
    """(y, mean, stat, mask bits) of the eager path: one plan lookup for both kernels."""
    relu = activation == "relu"
    if x.numel() == 0 or not use_triton(x):
        if training:
            mean, stat = _stats(x, running_mean, running_var, momentum, eps)
        else:
            mean, stat = running_mean.to(launch.stat_dtype(x)), running_var
        y, bits = _apply(x, mean, stat, weight, bias, residual, eps, training, activation)
        return y, mean, stat, bits
    plan = launch.forward_plan(x, weight, bias, running_mean, running_var, residual, training, relu)
    if training:
        mean, stat = plan.stats(x, running_mean, running_var, momentum, eps)
    else:
        mean, stat = running_mean.to(plan.acc), running_var
    y, bits = plan.apply(x, mean, stat, weight, bias, residual, eps)
    return y, mean, stat, bits


class _BatchNormActFn(torch.autograd.Function):
    """The eager path: statistics and the fused pass in one Function, no custom-op dispatch
    (its Python costs more than these kernels take at ResNet's smaller stages)."""

    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        running_mean,
        running_var,
        residual,
        training,
        momentum,
        eps,
        activation,
    ):
        y, mean, stat, bits = _forward(
            x,
            weight,
            bias,
            running_mean,
            running_var,
            residual,
            training,
            momentum,
            eps,
            activation,
        )
        _save(ctx, (x, mean, stat, weight, bias, residual, eps, training, activation), bits)
        return y

    @staticmethod
    def backward(ctx, dy):
        dx, _, _, dweight, dbias, dresidual, *_ = _input_grads(ctx, dy, _backward_impl)
        return dx, dweight, dbias, None, None, dresidual, None, None, None, None


# ---- custom ops: what torch.compile traces (fake implementations, registered autograd) ----

batch_norm_stats = torch.library.custom_op(
    "gpushape::batch_norm_stats", _stats, mutates_args=("running_mean", "running_var")
)
batch_norm_act_apply = torch.library.custom_op(
    "gpushape::batch_norm_act_apply", _apply, mutates_args=()
)
batch_norm_act_backward = torch.library.custom_op(
    "gpushape::batch_norm_act_backward", _backward_impl, mutates_args=()
)


@batch_norm_stats.register_fake
def _(x, running_mean, running_var, momentum, eps):
    mean = x.new_empty(x.shape[1], dtype=launch.stat_dtype(x))
    return mean, torch.empty_like(mean)


@batch_norm_act_apply.register_fake
def _(x, mean, stat, weight, bias, residual, eps, training, activation):
    n, c, h, w = x.shape
    shape = (n * h * w, (c + 7) // 8) if activation == "relu" else (0,)
    return torch.empty_like(x), x.new_empty(shape, dtype=torch.uint8)


@batch_norm_act_backward.register_fake
def _(dy, x, weight, mean, stat, bits, eps, training, activation, res_grad):
    dres = torch.empty_like(x) if res_grad else x.new_empty((0,))
    return torch.empty_like(x), torch.empty_like(mean), torch.empty_like(mean), dres


def _setup_context(ctx, inputs, output):
    _save(ctx, inputs, output[1])
    ctx.mark_non_differentiable(output[1])


batch_norm_act_apply.register_autograd(
    lambda ctx, dy, _dbits: _input_grads(ctx, dy, batch_norm_act_backward),
    setup_context=_setup_context,
)


# ---- functional and module ----


def _check(x, weight, bias, running_mean, running_var, residual, training, eps, activation):
    if not isinstance(x, Tensor) or x.dim() != 4:
        got = f"{x.dim()}-D of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x)
        raise ValueError(f"{_OP}: expected a 4-D (N, C, H, W) input, got {got}")
    given = dict(
        x=x,
        weight=weight,
        bias=bias,
        running_mean=running_mean,
        running_var=running_var,
        residual=residual,
    )
    device = x.device
    if not all(
        t is None or (t.dtype in FLOAT_DTYPES and t.device == device) for t in given.values()
    ):  # the checks below say what is wrong
        check_float(_OP, **given)
        check_same_device(_OP, **given)
    c = x.shape[1]
    if c == 0:
        raise ValueError(f"{_OP}: the input has 0 channels (shape {tuple(x.shape)})")
    for name in ("weight", "bias", "running_mean", "running_var"):
        t = given[name]
        if t is not None and tuple(t.shape) != (c,):
            raise ValueError(
                f"{_OP}: {name} must have shape ({c},) to match the input's "
                f"C = {c}, got {tuple(t.shape)}"
            )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"{_OP}: residual must match the input's shape and dtype "
            f"{tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} "
            f"{residual.dtype}"
        )
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{_OP}: give both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ValueError(
            f"{_OP}: eval (training=False) normalises with running_mean and "
            "running_var; pass them, or training=True for batch statistics"
        )
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"{_OP}: eps must be a finite number >= 0, got {eps}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{_OP}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if training and x.shape[0] * x.shape[2] * x.shape[3] == 1:  # torch's error, word for word
        raise ValueError(
            f"Expected more than 1 value per channel when training, got input size {x.size()}"
        )


def batch_norm_act(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
    activation: str = "relu",
    residual: Tensor | None = None,
) -> Tensor:
    """act(batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    + residual) for a 4-D NCHW or channels_last x, as one fused op (see the module docstring).
    """
    _check(x, weight, bias, running_mean, running_var, residual, training, eps, activation)
    eps, momentum = float(eps), float(momentum)
    if functorch_active():  # torch.func: PyTorch's own ops, which it differentiates
        y = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
        y = y if residual is None else y + residual
        return F.relu(y) if activation == "relu" else y
    if eager_path(x):
        return _BatchNormActFn.apply(
            x,
            weight,
            bias,
            running_mean,
            running_var,
            residual,
            training,
            momentum,
            eps,
            activation,
        )
    if training:
        mean, stat = batch_norm_stats(x.detach(), running_mean, running_var, momentum, eps)
    else:
        mean, stat = running_mean.to(launch.stat_dtype(x)), running_var
    return batch_norm_act_apply(x, mean, stat, weight, bias, residual, eps, training, activation)[0]


class BatchNormAct2d(nn.BatchNorm2d):
    """nn.BatchNorm2d followed by `+ residual` and an activation, fused.

    Same parameters, buffers and state_dict as nn.BatchNorm2d (a torchvision checkpoint loads
    with strict=True), same running-stat and num_batches_tracked behaviour (momentum=None:
    cumulative average). forward(x, residual=None).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        activation: str = "relu",
        device=None,
        dtype=None,
    ):
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"BatchNormAct2d: activation must be one of {ACTIVATIONS}, got {activation!r}"
            )
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype
        )
        self.activation = activation

    @classmethod
    def from_batchnorm(cls, bn: nn.BatchNorm2d, activation: str = "relu") -> BatchNormAct2d:
        """A BatchNormAct2d that shares bn's parameters and buffers (not copies: optimizer state
        and checkpoints that hold bn's tensors keep pointing at the live ones)."""
        if not isinstance(bn, nn.BatchNorm2d):
            raise TypeError(f"from_batchnorm: expected nn.BatchNorm2d, got {type(bn).__name__}")
        new = cls(
            bn.num_features,
            bn.eps,
            bn.momentum,
            bn.affine,
            bn.track_running_stats,
            activation,
            device="meta",
        )
        for name in ("weight", "bias"):
            setattr(new, name, getattr(bn, name))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            setattr(new, name, getattr(bn, name))
        return new.train(bn.training)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        self._check_input_dim(x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as nn.BatchNorm2d
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        return batch_norm_act(
            x,
            self.weight,
            self.bias,
            self.running_mean if track else None,
            self.running_var if track else None,
            batch_stats,
            factor,
            self.eps,
            self.activation,
            residual,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}"
