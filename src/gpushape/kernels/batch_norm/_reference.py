"""The plain-PyTorch reference of batch_norm_act: the CPU path, and the op's exact semantics
(statistics in fp32, or fp64 for fp64 input; running stats blended as torch does; the ReLU mask
kept as 1 bit an element, channel-packed; the smooth activations' gradient from the recomputed
pre-activation; where it is also the residual's gradient, the dx pass reads it in x's dtype)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ._plans import stat_dtype

CHANNEL = (1, -1, 1, 1)
aten = torch.ops.aten

# activation -> PyTorch's function (the functorch path and the tests' composition use these)
TORCH_ACTIVATIONS = {
    "relu": F.relu,
    "none": lambda y: y,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "hardswish": F.hardswish,
}
# smooth activation -> d act(h) / dh * dy, as PyTorch's backward kernels compute it
_ACT_BACKWARD = {
    "silu": aten.silu_backward,
    "gelu": lambda dy, h: aten.gelu_backward(dy, h, approximate="none"),
    "gelu_tanh": lambda dy, h: aten.gelu_backward(dy, h, approximate="tanh"),
    "hardswish": aten.hardswish_backward,
}


def pack_bits_ref(pos: Tensor) -> Tensor:
    """(N, C, H, W) bool -> (N*H*W, ceil(C/8)) uint8, bit k of byte j = channel 8j + k."""
    n, c, h, w = pos.shape
    nb = (c + 7) // 8
    rows = F.pad(pos.permute(0, 2, 3, 1).reshape(n * h * w, c).to(torch.int32), (0, 8 * nb - c))
    weights = torch.tensor([1 << k for k in range(8)], dtype=torch.int32, device=pos.device)
    return (rows.view(-1, nb, 8) * weights).sum(-1).to(torch.uint8)


def unpack_bits_ref(bits: Tensor, shape: torch.Size) -> Tensor:
    n, c, h, w = shape
    shifts = torch.arange(8, dtype=torch.int32, device=bits.device)
    rows = ((bits.to(torch.int32)[:, :, None] >> shifts) & 1).reshape(bits.shape[0], -1)[:, :c]
    return rows.reshape(n, h, w, c).permute(0, 3, 1, 2) != 0


def stats_ref(x, running_mean, running_var, momentum, eps):
    var, mean = torch.var_mean(x.to(stat_dtype(x)), dim=(0, 2, 3), correction=0)
    if running_mean is not None:
        n = x.numel() // x.shape[1]
        with torch.no_grad():
            acc = mean.dtype
            running_mean.copy_((1 - momentum) * running_mean.to(acc) + momentum * mean)
            running_var.copy_((1 - momentum) * running_var.to(acc) + momentum * var * n / (n - 1))
    return mean, torch.rsqrt(var + eps)


def _rstd_ref(stat: Tensor, acc: torch.dtype, eps: float, stat_is_var: bool) -> Tensor:
    return torch.rsqrt(stat.to(acc) + eps) if stat_is_var else stat.to(acc)


def _like(x: Tensor, value: Tensor) -> Tensor:
    """value in x's dtype and strides (what the fake implementation promises)."""
    out = torch.empty_like(x)
    out.copy_(value)
    return out


def _pre_activation(x, mean, stat, weight, bias, residual, eps, stat_is_var):
    """(x - mean) * rstd * weight + bias + residual in the statistics dtype."""
    acc = mean.dtype
    scale = _rstd_ref(stat, acc, eps, stat_is_var)
    if weight is not None:
        scale = scale * weight.to(acc)
    y = (x.to(acc) - mean.view(CHANNEL)) * scale.view(CHANNEL)
    if bias is not None:
        y = y + bias.to(acc).view(CHANNEL)
    if residual is not None:
        y = y + residual.to(acc)
    return y


def apply_ref(x, mean, stat, weight, bias, residual, eps, stat_is_var, activation: str):
    y = _pre_activation(x, mean, stat, weight, bias, residual, eps, stat_is_var)
    bits = x.new_empty((0,), dtype=torch.uint8)
    if activation == "relu":
        y = torch.where(y < 0, 0.0, y)  # keeps NaN, as torch.relu
        bits = pack_bits_ref(y > 0)
    elif activation != "none":
        y = TORCH_ACTIVATIONS[activation](y)
    return _like(x, y), bits


def _grads_from_dz(dz, x, weight, mean, rstd, training, dz_read=None):
    """(dx, dweight, dbias) of the normalisation, given dz = dL / d(pre-activation); training's
    dx reads `dz_read` (dz as stored) for its elementwise term when given."""
    acc = mean.dtype
    xmu = x.to(acc) - mean.view(CHANNEL)
    db = dz.sum((0, 2, 3))
    dw = (dz * xmu).sum((0, 2, 3)) * rstd
    a = rstd if weight is None else rstd * weight.to(acc)
    if training:
        n = x.numel() // x.shape[1]
        dz_e = dz if dz_read is None else dz_read
        dz_x = dz_e - (db / n).view(CHANNEL) - xmu * (rstd * dw / n).view(CHANNEL)
    else:
        dz_x = dz
    return _like(x, a.view(CHANNEL) * dz_x), dw, db


def backward_ref(dy, x, weight, mean, stat, bits, eps, training, relu, res_grad, dy2=None):
    """`dy2`: the output gradient's second part, added in fp32; training's dx pass then reads
    dz as stored (x's dtype), as the kernels do."""
    acc = mean.dtype
    rstd = _rstd_ref(stat, acc, eps, not training)
    dz = dy.to(acc) if dy2 is None else dy.to(acc) + dy2.to(acc)
    if relu:
        dz = torch.where(unpack_bits_ref(bits, x.shape), dz, 0.0)
    stored = dz.to(x.dtype).to(acc) if dy2 is not None else None
    dx, dw, db = _grads_from_dz(dz, x, weight, mean, rstd, training, stored)
    dres = _like(x, dz) if res_grad else x.new_empty((0,))
    return dx, dw, db, dres


def act_backward_ref(dy, x, weight, bias, residual, mean, stat, eps, training, activation: str):
    """The smooth activations' backward: h recomputed, dz = dy * act'(h) summed in fp32; with a
    residual dz is also its gradient, and training's dx pass reads it as stored (x's dtype)."""
    acc = mean.dtype
    h = _pre_activation(x, mean, stat, weight, bias, residual, eps, not training)
    dz = _ACT_BACKWARD[activation](dy.to(acc), h)
    stored = dz.to(x.dtype).to(acc) if residual is not None else None
    rstd = _rstd_ref(stat, acc, eps, not training)
    dx, dw, db = _grads_from_dz(dz, x, weight, mean, rstd, training, stored)
    dres = _like(x, dz) if residual is not None else x.new_empty((0,))
    return dx, dw, db, dres
