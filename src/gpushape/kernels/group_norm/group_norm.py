"""Group normalization with an optional activation, forward and backward in a few passes over
the tensor:

    y = act(group_norm(x, G, weight, bias, eps))      act: none, relu, silu, gelu, gelu_tanh,
                                                      hardswish

PyTorch's eager GroupNorm takes each (sample, group)'s statistics in one thread block, so a
one-group norm at batch 64 (PoolFormer's) runs 64 blocks on an H100's 132 SMs, and its backward
adds three more kernels; an activation after it is a kernel and a tensor of its own each way.
In ResNet-50-GN's eager training step on an H100 the GroupNorms took 11.5 of 25.3 ms of kernel
time (`benchmarks/results/correlate-h100/correlate-gn2.json`). These kernels split every
reduction over the pixels until the SMs are full, and run the activation in the norm's
elementwise pass: the forward reads x twice and writes y once, the backward reads dy and x
twice and writes dx once (`_launch.py`), the sums in float32 and deterministic.

Input (N, C, *): contiguous, or a 4-D tensor in channels_last memory (y and dx keep that
layout); other strides are copied contiguous first. float32 / float16 / bfloat16 (float64 too);
weight and bias (C,) or None, any float dtype, their gradients in theirs. Under CUDA's autocast
a float16 / bfloat16 x gives a float32 y, as F.group_norm (autocast to float32 there) does.

Layers: Triton kernels (`_kernels.py`), launchers (`_launch.py`) with the plain-PyTorch
reference for CPU tensors (`_reference.py`); here the custom ops gpushape::group_norm_act and
gpushape::group_norm_act_backward (fake implementations, registered autograd: torch.compile,
CUDA graphs, meta tensors), the eager autograd.Function, the functional `group_norm_act` and the
module `GroupNormAct`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .._dispatch import (
    FLOAT_DTYPES,
    check_float,
    check_same_device,
    eager_path,
    functorch_active,
)
from .._pixels import acc_dtype
from ._launch import empty_out, group_norm_backward, group_norm_forward
from ._reference import ACTIVATIONS, _compose

__all__ = ["GroupNormAct", "group_norm_act"]
_OP = "group_norm_act"


# ---- custom ops: what torch.compile and meta tensors go through -----------------------------
@torch.library.custom_op("gpushape::group_norm_act", mutates_args=())
def group_norm_op(
    x: Tensor, weight: Tensor, bias: Tensor, num_groups: int, eps: float, act: int, out_fp32: bool
) -> tuple[Tensor, Tensor]:
    """(y, stats): stats (2, N, num_groups), the group means and 1/std in float32 (float64 for
    float64 x), which the backward reads."""
    out = torch.float32 if out_fp32 else x.dtype
    return group_norm_forward(x, weight, bias, num_groups, eps, act, out)


@group_norm_op.register_fake
def _(x, weight, bias, num_groups, eps, act, out_fp32):
    stats = x.new_empty((2, x.shape[0], num_groups), dtype=acc_dtype(x.dtype))
    return empty_out(x, torch.float32 if out_fp32 else x.dtype), stats


@torch.library.custom_op("gpushape::group_norm_act_backward", mutates_args=())
def group_norm_backward_op(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    stats: Tensor,
    num_groups: int,
    eps: float,
    act: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias); the parameter gradients are (C,) in the parameters' dtypes."""
    return group_norm_backward(dy, x, weight, bias, stats, num_groups, eps, act)


@group_norm_backward_op.register_fake
def _(dy, x, weight, bias, stats, num_groups, eps, act):
    return empty_out(x), torch.empty_like(weight), torch.empty_like(bias)


def _setup_context(ctx, inputs, output):
    x, weight, bias, num_groups, eps, act, _out_fp32 = inputs
    ctx.save_for_backward(x, weight, bias, output[1])
    ctx.num_groups, ctx.eps, ctx.act = num_groups, eps, act
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # the statistics never get a gradient: no zeros built


def _backward(ctx, dy, _dstats):
    if dy is None:
        return None, None, None, None, None, None, None
    x, weight, bias, stats = ctx.saved_tensors
    dx, dw, db = group_norm_backward_op(
        dy, x, weight, bias, stats, ctx.num_groups, ctx.eps, ctx.act
    )
    return dx, dw, db, None, None, None, None


group_norm_op.register_autograd(_backward, setup_context=_setup_context)


# ---- eager path: one autograd.Function straight to the launchers ----------------------------
class _GroupNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, num_groups, eps, act, out_dtype):
        y, stats = group_norm_forward(x, weight, bias, num_groups, eps, act, out_dtype)
        ctx.save_for_backward(x, weight, bias, stats)
        ctx.num_groups, ctx.eps, ctx.act = num_groups, eps, act
        return y

    @staticmethod
    @once_differentiable  # the backward kernels have no derivative of their own
    def backward(ctx, dy):
        x, weight, bias, stats = ctx.saved_tensors
        dx, dw, db = group_norm_backward(
            dy, x, weight, bias, stats, ctx.num_groups, ctx.eps, ctx.act
        )
        return dx, dw, db, None, None, None, None


# ---- checks ---------------------------------------------------------------------------------
_FLOATS = frozenset(FLOAT_DTYPES)


def _param_ok(t, x: Tensor) -> bool:
    return t is None or (
        isinstance(t, Tensor)
        and t.dtype in _FLOATS
        and t.device == x.device
        and t.numel() == x.shape[1]
    )


def _check(x, num_groups, weight, bias, eps, activation) -> int:
    """The activation's code; `_check_each` where something is off (an eager call's host time
    is the kernels' budget: the common case is one expression)."""
    if (
        isinstance(x, Tensor)
        and x.dtype in _FLOATS
        and x.dim() >= 2
        and type(num_groups) is int
        and num_groups >= 1
        and x.shape[1] % num_groups == 0
        and eps >= 0
        and activation in ACTIVATIONS
        and _param_ok(weight, x)
        and _param_ok(bias, x)
    ):
        return ACTIVATIONS[activation]
    return _check_each(x, num_groups, weight, bias, eps, activation)


def _check_each(x, num_groups, weight, bias, eps, activation) -> int:
    """The activation's code, after one-line errors for what the kernels cannot take."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{_OP}: {name} must be a Tensor or None, got {type(t).__name__}")
    if x is None:
        raise TypeError(f"{_OP}: x must be a Tensor, got None")
    check_float(_OP, x=x, weight=weight, bias=bias)
    check_same_device(_OP, x=x, weight=weight, bias=bias)
    if x.dim() < 2:
        raise ValueError(f"{_OP}: x must be (N, C, *), got shape {tuple(x.shape)}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"{_OP}: num_groups must be an int >= 1, got {num_groups!r}")
    c = x.shape[1]
    if c % num_groups:
        raise ValueError(f"{_OP}: {c} channels do not split into {num_groups} groups")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.numel() != c:
            raise ValueError(
                f"{_OP}: {name} must hold one value per channel ({c}), got shape {tuple(t.shape)}"
            )
    if not eps >= 0:  # NaN too
        raise ValueError(f"{_OP}: eps must be >= 0, got {eps}")
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{_OP}: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}"
        )
    return ACTIVATIONS[activation]


def _autocast_fp32(x: Tensor) -> bool:
    """Whether F.group_norm would give a float32 y here: CUDA autocast on, with a
    half-precision x (CUDA's autocast runs group_norm in float32; the CPU's keeps x's dtype)."""
    return (
        x.device.type == "cuda"
        and x.dtype in (torch.float16, torch.bfloat16)
        and torch.is_autocast_enabled("cuda")
    )


# ---- functional and module ------------------------------------------------------------------
def group_norm_act(
    x: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    activation: str = "none",
) -> Tensor:
    """act(F.group_norm(x, num_groups, weight, bias, eps)) in one forward and one backward pass
    of gpushape's kernels (see the module docstring); activation: none, relu, silu, gelu,
    gelu_tanh or hardswish."""
    eps = float(eps)
    act = _check(x, num_groups, weight, bias, eps, activation)
    c = x.shape[1]
    if weight is None:
        weight = torch.ones(c, dtype=x.dtype, device=x.device)
    if bias is None:
        bias = torch.zeros(c, dtype=weight.dtype, device=x.device)
    w = weight if weight.dim() == 1 else weight.reshape(-1)
    b = bias if bias.dim() == 1 else bias.reshape(-1)
    out_fp32 = _autocast_fp32(x)
    if functorch_active():  # torch.func: the plain-PyTorch composition, which it understands
        y = _compose(x, w.to(x.dtype), b.to(x.dtype), num_groups, eps, act)
        return y.float() if out_fp32 else y
    if not (w.is_contiguous() and b.is_contiguous()):
        w, b = w.contiguous(), b.contiguous()
    if eager_path(x):
        out = torch.float32 if out_fp32 else x.dtype
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or b.requires_grad):
            return _GroupNormFn.apply(x, w, b, num_groups, eps, act, out)
        return group_norm_forward(x, w, b, num_groups, eps, act, out)[0]
    return group_norm_op(x, w, b, num_groups, eps, act, out_fp32)[0]


class GroupNormAct(nn.GroupNorm):
    """nn.GroupNorm, followed by an activation, on gpushape's kernels: the same parameters under
    the same names (a state_dict loads either way). `from_module` takes over an nn.GroupNorm's
    own parameters (timm's GroupNorm and GroupNorm1 are nn.GroupNorm subclasses)."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        activation: str = "none",
        device=None,
        dtype=None,
    ):
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"GroupNormAct: activation must be one of {', '.join(ACTIVATIONS)}, "
                f"got {activation!r}"
            )
        super().__init__(num_groups, num_channels, eps, affine, device=device, dtype=dtype)
        self.activation = activation

    @classmethod
    def from_module(cls, module: nn.Module, activation: str = "none") -> GroupNormAct:
        """This module holding `module`'s very parameters (None ones stay None). TypeError for
        a module that is not an nn.GroupNorm."""
        if not isinstance(module, nn.GroupNorm):
            raise TypeError(
                f"GroupNormAct.from_module: expected an nn.GroupNorm, got {type(module).__name__}"
            )
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"GroupNormAct: activation must be one of {', '.join(ACTIVATIONS)}, "
                f"got {activation!r}"
            )
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.num_groups, new.num_channels = module.num_groups, module.num_channels
        new.eps, new.affine, new.activation = module.eps, module.affine, activation
        new.register_parameter("weight", module.weight)  # the Parameter itself, or None
        new.register_parameter("bias", module.bias)
        return new

    def forward(self, x: Tensor) -> Tensor:
        return group_norm_act(x, self.num_groups, self.weight, self.bias, self.eps, self.activation)

    def extra_repr(self) -> str:
        act = "" if self.activation == "none" else f", activation={self.activation}"
        return super().extra_repr() + act
