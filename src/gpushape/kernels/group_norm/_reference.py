"""Plain-PyTorch group normalization with an activation: what CPU tensors run (unless
TRITON_INTERPRET=1) and what the Triton kernels are tested against.

Forward and backward in float32 (float64 for float64 input), rounded once to the output's dtype,
as the kernels do. The backward differentiates the same composition with autograd, so the
formula the kernels hand-write is checked against PyTorch's own derivatives.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

# the activation codes of the kernels (batch_norm/_act_math.py's ACT_CODES, and ReLU's 5)
ACTIVATIONS = {
    "none": 0,
    "silu": 1,
    "gelu": 2,
    "gelu_tanh": 3,
    "hardswish": 4,
    "relu": 5,
}
_FUNCTIONS = {
    0: lambda z: z,
    1: F.silu,
    2: F.gelu,
    3: lambda z: F.gelu(z, approximate="tanh"),
    4: F.hardswish,
    5: torch.relu,
}


def _no_autocast(x: torch.Tensor):
    """Autocast off for x's device type (a device autocast does not know: nothing to turn off)."""
    if x.device.type in ("cpu", "cuda"):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _compose(x, weight, bias, groups, eps, act):
    return _FUNCTIONS[act](F.group_norm(x, groups, weight, bias, eps))


def statistics(x: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """(2, N, groups): the group means and 1/std, in float32 (float64)."""
    xs = x.detach().to(_acc(x)).reshape(x.shape[0], groups, -1)
    var, mean = torch.var_mean(xs, dim=2, unbiased=False)
    return torch.stack((mean, torch.rsqrt(var + eps)))


def reference_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    groups: int,
    eps: float,
    act: int,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y in out_dtype and x's layout, stats: (2, N, groups) means and 1/std)."""
    acc = _acc(x)
    with _no_autocast(x):
        y = _compose(x.to(acc), weight.to(acc), bias.to(acc), groups, eps, act)
    out = torch.empty_like(x, dtype=out_dtype)
    return out.copy_(y), statistics(x, groups, eps)


def _act_backward(act: int, dy: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The gradient at z from dy at act(z): ATen's own backward ops, as autograd runs them."""
    aten = torch.ops.aten
    if act == 5:
        return aten.threshold_backward(dy, torch.relu(z), 0)
    if act == 1:
        return aten.silu_backward(dy, z)
    if act in (2, 3):
        return aten.gelu_backward(dy, z, approximate="tanh" if act == 3 else "none")
    if act == 4:
        return aten.hardswish_backward(dy, z)
    return dy


def reference_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    groups: int,
    eps: float,
    act: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias): the gradients of reference_forward, in the dtypes of x, weight and
    bias, from ATen's group-norm and activation backward ops called directly (autograd is off
    inside a custom op, where torch.compile and meta tensors run this)."""
    acc = _acc(x)
    n, c = x.shape[0], x.shape[1]
    hw = x[0, 0].numel()
    aten = torch.ops.aten
    with _no_autocast(x):
        xs = x.detach().to(acc).contiguous()
        ws, bs = weight.detach().to(acc), bias.detach().to(acc)
        z, mean, rstd = aten.native_group_norm(xs, ws, bs, n, c, hw, groups, eps)
        dz = _act_backward(act, dy.to(acc).contiguous(), z)
        dx, dw, db = aten.native_group_norm_backward(
            dz, xs, mean, rstd, ws, n, c, hw, groups, [True, True, True]
        )
    out = torch.empty_like(x)
    return out.copy_(dx), dw.to(weight.dtype), db.to(bias.dtype)
